//! `textnet bench` (placeholder).
use anyhow::{Result, bail};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<()> {
    bail!("not yet")
}
