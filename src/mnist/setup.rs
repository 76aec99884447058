//! The pieces of `textnet mnist`'s setup: the device and the data read side by side, --out locked and
//! checked against the data, the validation split, and the models at --out and --resume with the loss an
//! epoch must beat.

use super::Classifier;
use super::args::MnistArgs;
use super::cnn::CnnShape;
use super::idx;
use super::idx::Split;
use super::model::MlpShape;
use crate::datasets::mnist::{self, Dataset, MnistData};
use crate::device;
use crate::harness::checkpoint;
use crate::harness::report::{self, Display};
use crate::io::fsutil;
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Opens the device and reads the data side by side: opening the GPU (a CUDA context: ~0.5 s) and
/// decoding the data files (~0.3 s) overlap. Returns the device, its line, the data, and when each was
/// ready in seconds from `started`.
pub(super) fn device_and_data(
    args: &MnistArgs,
    display: &Display,
    started: Instant,
) -> Result<(device::Backend, String, MnistData, f64, f64)> {
    let (device, data, device_s, data_s) = std::thread::scope(|scope| {
        let reading = scope.spawn(|| {
            let data = mnist::load(args.dataset, args.data.as_deref(), &|note| display.line(note));
            (data, started.elapsed().as_secs_f64())
        });
        let device = device::select_described(args.run.device);
        let device_s = started.elapsed().as_secs_f64();
        let (data, data_s) = reading.join().unwrap_or_else(|_| (Err(anyhow::anyhow!("reading the data failed")), 0.0));
        (device, data, device_s, data_s)
    });
    let (backend, device_line) = device?;
    Ok((backend, device_line, data?, device_s, data_s))
}

/// Locks --out, which must not be one of the data files of `dir`, and checks --plot against the files
/// the run reads.
pub(super) fn lock_out(args: &MnistArgs, dir: &Path) -> Result<fsutil::OutputLock> {
    let inputs: Vec<PathBuf> = mnist::FILES.iter().flat_map(|f| [dir.join(f), dir.join(format!("{f}.gz"))]).collect();
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|p| ("data file", p.as_path())).collect();
    let lock = fsutil::check_output(&args.run.out, &inputs)?;
    let mut inputs = inputs;
    inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
    crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
    if shadows_data_file(&args.run.out, dir) {
        bail!(
            "--out {} would be read as a data file of {}; choose another name",
            args.run.out.display(),
            dir.display()
        );
    }
    Ok(lock)
}

/// The model already at --out that a run must beat: none with --overwrite, or where --out is the
/// --resume model; a model of another dataset or another --model is refused.
pub(super) fn existing(args: &MnistArgs) -> Result<Option<Classifier>> {
    let existing = match &args.resume {
        Some(resume) if fsutil::same_file(resume, &args.run.out) => None,
        _ => existing_out(&args.run.out)?,
    };
    if let Some((_, meta)) = &existing
        && !args.run.overwrite
        && meta.get("dataset").is_some_and(|d| d != args.dataset.name())
    {
        let what = format!("an MNIST model of another dataset ({})", meta.get("dataset").map_or("", String::as_str));
        return Err(checkpoint::other_data(&args.run.out, &what));
    }
    let existing = existing.map(|(old, _)| old).filter(|_| !args.run.overwrite);
    if let Some(old) = &existing
        && old.kind() != args.model
    {
        bail!(
            "--out {} holds an MNIST {} model and this run trains the {}; choose another --out",
            args.run.out.display(),
            report::flag_value(&old.kind()).to_uppercase(),
            report::flag_value(&args.model).to_uppercase()
        );
    }
    Ok(existing)
}

/// The loss an epoch must beat to be saved: that of the model already at --out and of the --resume'd one,
/// measured on the data each epoch is judged by (`judged`: the validation split, else the test set, and
/// the name of its loss).
pub(super) fn baseline(
    args: &MnistArgs,
    existing: Option<&Classifier>,
    params: &Classifier,
    judged: (&Split, &str),
    display: &Display,
) -> Result<Option<f64>> {
    let (judged_by, loss_name) = judged;
    let mut baseline = match existing {
        Some(old) if old.fits_mnist() => {
            let loss = checkpoint::baseline(&args.run.out, old.evaluate(judged_by)?.mean_loss(), loss_name)?;
            display.line(&format!(
                "--out {} already holds a model of {loss_name} {loss:.4}; only a better epoch replaces it",
                args.run.out.display()
            ));
            Some(loss)
        }
        _ => None,
    };
    if let Some(path) = &args.resume {
        let loss = params.evaluate(judged_by)?.mean_loss();
        if !loss.is_finite() {
            bail!(
                "--resume {}: the model's outputs on this data are not finite ({loss_name} {loss}), so it cannot be \
                 trained further; train a new model instead",
                path.display()
            );
        }
        display.line(&format!("{} has {loss_name} {loss:.4}; only a better epoch is saved", path.display()));
        baseline = Some(baseline.map_or(loss, |b| b.min(loss)));
    }
    Ok(baseline)
}

/// Whether `out` is one of the names the data files are looked up under in `data_dir`.
fn shadows_data_file(out: &Path, data_dir: &Path) -> bool {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    fsutil::same_file(dir, data_dir) && mnist::FILES.iter().any(|f| *name == **f || *name == format!("{f}.gz"))
}

/// Moves the last `fraction` of `train` (at least one image, leaving at least one) into a validation split.
pub(super) fn hold_out(train: &mut Split, fraction: f64) -> Result<Split> {
    let n = train.len();
    let n_val = ((n as f64 * fraction).ceil() as usize).max(1);
    if n_val >= n {
        bail!("--val-split {fraction} of {n} training images leaves none to train on");
    }
    let keep = n - n_val;
    let val = Split {
        images: train.images[keep * train.pixels..].to_vec(),
        labels: train.labels[keep..].to_vec(),
        pixels: train.pixels,
    };
    train.truncate(keep);
    Ok(val)
}

/// The `--resume` model, refused unless it is of this run's dataset, kind and `shape` (the MLP's; the
/// CNN has one).
pub(super) fn resumed_model(args: &MnistArgs, shape: MlpShape) -> Result<Option<Classifier>> {
    let Some(path) = &args.resume else { return Ok(None) };
    let bytes = fsutil::read_input(path, "model file")?;
    let shown = path.display();
    let (model, meta) = Classifier::from_safetensors(&bytes)
        .map_err(|e| anyhow::anyhow!("--resume {shown} is not a textnet MNIST model file: {e:#}"))?;
    if let Some(name) = meta.get("dataset").filter(|&d| d != args.dataset.name()) {
        let title = <Dataset as clap::ValueEnum>::from_str(name, false).map_or(name.as_str(), |d| d.title());
        bail!(
            "--resume {shown}: a model trained on {title}, and this run trains on {} (give --dataset {name})",
            args.dataset.title()
        );
    }
    if model.kind() != args.model {
        let kind = report::flag_value(&model.kind());
        bail!(
            "--resume {shown}: an MNIST {} model, and this run trains the {} (give --model {kind})",
            kind.to_uppercase(),
            report::flag_value(&args.model).to_uppercase()
        );
    }
    match &model {
        Classifier::Mlp(p) if !model.fits_mnist() => bail!(
            "--resume {shown}: an MLP of {} inputs and {} classes; MNIST images need {} and {}",
            p.shape.inputs,
            p.shape.classes,
            idx::PIXELS,
            idx::CLASSES
        ),
        Classifier::Mlp(p) if p.shape != shape => bail!(
            "--resume {shown}: an MLP of {} hidden units ({}), and this run's has {} ({}) (give --hidden {} \
             --activation {})",
            p.shape.hidden,
            p.shape.activation.name(),
            shape.hidden,
            shape.activation.name(),
            p.shape.hidden,
            p.shape.activation.name()
        ),
        Classifier::Cnn(p) if p.shape != CnnShape::MNIST => bail!(
            "--resume {shown}: a CNN of another shape than the one this command trains ({} channels, then {}; \
             {} hidden units)",
            CnnShape::MNIST.c1,
            CnnShape::MNIST.c2,
            CnnShape::MNIST.fc
        ),
        _ => Ok(Some(model)),
    }
}

/// The MNIST model (MLP or CNN) already at `out`, with its metadata (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<(Classifier, std::collections::HashMap<String, String>)>> {
    fsutil::existing_model(out, "MNIST", Classifier::from_safetensors)
}
