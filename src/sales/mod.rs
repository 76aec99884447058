//! Regression on a table (issue 12 §3), by default the roadmap's `sales.tsv`: Linear(n, H) → ReLU →
//! Linear(H, 1) predicting a numeric column from numeric, one-hot categorical and day-of-year features,
//! mean squared error on standardised values. Table loading and features `data`, CPU reference `model`,
//! GPU trainer `gpu`, the interface over both `train`.

pub mod bench;
pub mod checks;
pub mod cli;
pub mod data;
pub mod gpu;
pub mod model;
pub mod modelfile;
pub mod train;
