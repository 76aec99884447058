//! `textnet mnist` (placeholder until the MNIST pipeline lands).
use anyhow::{Result, bail};

#[derive(clap::Args, Debug)]
pub struct MnistArgs {}

pub fn run(_args: MnistArgs) -> Result<()> {
    bail!("not yet")
}
