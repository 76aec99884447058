//! `textnet selftest`: every GPU kernel against its CPU reference (placeholder).
use anyhow::{Result, bail};

#[derive(clap::Args, Debug)]
pub struct SelftestArgs {}

pub fn run(_args: SelftestArgs) -> Result<()> {
    bail!("not yet")
}
