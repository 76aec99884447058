//! `textnet train` and `textnet predict` (placeholder until the text CLI lands).
use anyhow::{Result, bail};

#[derive(clap::Args, Debug)]
pub struct TrainArgs {}
#[derive(clap::Args, Debug)]
pub struct PredictArgs {}

pub fn train(_args: TrainArgs) -> Result<()> {
    bail!("not yet")
}
pub fn predict(_args: PredictArgs) -> Result<()> {
    bail!("not yet")
}
