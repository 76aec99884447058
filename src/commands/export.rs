//! `textnet export --onnx OUT.onnx MODEL`: a trained model file written as an ONNX model (operator set
//! `onnx::OPSET`), for runtimes outside textnet (onnxruntime and the like). The pipeline whose model kind
//! the file names writes the graph (`pipelines::ALL`, `pipeline::OnnxExport`): a network of `textnet fit`
//! or of the Python package's `Sequential`, an MNIST MLP or CNN, or a character-level Transformer. A
//! model of another kind is refused, naming what it is.

use crate::io::fsutil;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
/// The flags of `textnet export`.
pub struct ExportArgs {
    /// Write the model as an ONNX file (operator set 17) here: inputs `input` (a batch of the network's
    /// inputs) or `input_ids` (a Transformer's int64 token ids), outputs `logits` (and `probabilities`
    /// for classes, or `values` for a regressor), the batch axis dynamic
    #[arg(long, value_name = "OUT.onnx")]
    pub onnx: PathBuf,
    /// The model file: written by `textnet fit`, `textnet mnist` or `textnet transformer`, or by the
    /// Python package's `Sequential.save`
    pub model: PathBuf,
}

/// The kinds of model file export writes, for messages.
const COVERED: &str = "a network of textnet fit or Sequential, an MNIST MLP or CNN, or a Transformer";

/// The ONNX bytes of the model file `bytes`, written by the pipeline whose kind the file names.
pub fn onnx_bytes(bytes: &[u8]) -> Result<Vec<u8>> {
    let kind = crate::io::modelkind::claimed_by(bytes);
    let pipeline = crate::pipelines::ALL.iter().find(|p| kind.is_some_and(|k| p.models.contains(&k)));
    if let Some(hook) = pipeline.and_then(|p| p.onnx.as_ref()) {
        return (hook.export)(bytes);
    }
    if let Some(kind) = kind {
        bail!("ONNX export does not cover {} (it covers {COVERED})", kind.what);
    }
    let (_, header) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
    match header.metadata().as_ref().and_then(|m| crate::io::modelkind::tag(m).map(str::to_string)) {
        Some(other) => bail!("not a textnet model file: its metadata names the format {other:?}"),
        None => bail!("not a textnet model file: its metadata names no format"),
    }
}

/// Writes the ONNX bytes `onnx` to `out` (given by `flag`, for messages), atomically; a model file
/// there, or any of `inputs`, is refused (`fsutil::check_data_output`).
pub fn save(flag: &str, out: &Path, onnx: &[u8], inputs: &[(&str, &Path)]) -> Result<()> {
    let _lock = fsutil::check_data_output(flag, out, inputs)?;
    fsutil::write_atomic(out, onnx)
}

/// Runs `textnet export`.
pub fn run(args: ExportArgs) -> Result<()> {
    let bytes = fsutil::read_input(&args.model, "model file")?;
    let onnx = onnx_bytes(&bytes).with_context(|| format!("model file {}", args.model.display()))?;
    save("--onnx", &args.onnx, &onnx, &[("model file", &args.model)])?;
    crate::harness::console::err(&format!(
        "{}: ONNX (operator set {}) of {}",
        args.onnx.display(),
        crate::io::onnx::OPSET,
        args.model.display()
    ));
    Ok(())
}
