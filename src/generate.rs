//! `textnet generate`: continues a prompt by sampling from a model file one token (or character) at a
//! time, on the CPU. The pipeline whose model kind the file names generates (`pipelines::ALL`); a model
//! file of a kind that does not generate is refused with what it is (`modelkind`).

use crate::sampling::{GenerateArgs, MAX_LENGTH};
use anyhow::{Result, bail};

pub fn run(args: GenerateArgs) -> Result<()> {
    if !(1..=MAX_LENGTH).contains(&args.length) {
        bail!("--length must be between 1 and {MAX_LENGTH}, got {}", args.length);
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature must be 0 or more, got {}", args.temperature);
    }
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    let bytes = crate::fsutil::read_input(&args.model, "model file")?;
    let kind = crate::modelkind::of_bytes(&bytes);
    let generate =
        crate::pipelines::ALL.iter().find(|p| kind.is_some_and(|k| p.models.contains(&k))).and_then(|p| p.generate);
    match (generate, kind) {
        (Some(generate), _) => generate(&bytes, &args),
        (None, Some(kind)) => {
            bail!("{}: it is {} (for {}); it does not generate text", args.model.display(), kind.what, kind.used_by)
        }
        (None, None) => bail!("{} is not a textnet model that generates text", args.model.display()),
    }
}
