//! Models the user writes (`textnet fit --layers SPEC`). So far: the spec itself, parsed and its
//! shapes followed through every layer (`spec`).

pub mod spec;
