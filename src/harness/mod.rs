//! The run harness every training command and bench stands on: the skeleton of a run and how it ends
//! (`run`), the flags every training command shares (`args`), what a run shows and reports (`report`,
//! `console`, `plot`, `tensorboard`), which epochs it saves (`checkpoint`), Ctrl-C (`interrupt`), the
//! selftest's checks (`check`), device timing for the benches (`timing`) and where start-up time goes
//! (`phases`).

pub mod args;
pub mod check;
pub mod checkpoint;
pub mod console;
pub mod interrupt;
pub mod phases;
pub mod plot;
pub mod report;
pub mod run;
pub mod tensorboard;
pub mod timing;
