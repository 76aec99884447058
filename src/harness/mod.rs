//! The run harness every training command and bench stands on: the skeleton of a run and how it ends
//! (`run`), the flags every training command shares (`args`), what a run shows and reports (`report`,
//! `console`, `plot`, `tensorboard`, a classifier's `classification`), which epochs it saves
//! (`checkpoint`), Ctrl-C (`interrupt`), the selftest's checks (`check`) and device timing for the
//! benches (`timing`).

pub mod args;
pub mod check;
pub mod checkpoint;
pub mod classification;
pub mod console;
pub mod interrupt;
pub mod plot;
pub mod report;
pub mod run;
pub mod tensorboard;
pub mod timing;
