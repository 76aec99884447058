//! Finding the dataset on disk (and fetching MNIST when it is nowhere), then loading both splits.
//!
//! Each dataset is the same four IDX files, raw or gzipped. Without `--data DIR` the search goes
//! `$TEXTNET_DATA` (MNIST only; the files directly in it) → `$TEXTNET_DATA/<name>` → `./data/<name>` →
//! the textnet cache (`$TEXTNET_CACHE` or the user's cache dir, then `textnet/<name>`) → for
//! Fashion-MNIST the Debian package's `/usr/share/datasets/fashion-mnist`, where `<name>` is `mnist` or
//! `fashion-mnist`. When none has all four files, `curl` (if installed) fetches them from a public mirror
//! into the cache; failing that, the error names the files and the places to put them.

use super::idx::{Split, load_split};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The four files, in the order train images, train labels, test images, test labels.
pub const FILES: [&str; 4] =
    ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dataset {
    /// Handwritten digits 0–9
    Mnist,
    /// Zalando's Fashion-MNIST: ten kinds of clothing, same format
    Fashion,
}

impl Dataset {
    /// The `--dataset` value, also written to the model file's metadata.
    pub fn name(self) -> &'static str {
        match self {
            Dataset::Mnist => "mnist",
            Dataset::Fashion => "fashion",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Dataset::Mnist => "MNIST",
            Dataset::Fashion => "Fashion-MNIST",
        }
    }

    /// Directory name under `./data`, `$TEXTNET_DATA` and the cache.
    fn dir_name(self) -> &'static str {
        match self {
            Dataset::Mnist => "mnist",
            Dataset::Fashion => "fashion-mnist",
        }
    }

    /// Where `FILES` + ".gz" can be downloaded from.
    fn mirror(self) -> &'static str {
        match self {
            Dataset::Mnist => "https://storage.googleapis.com/cvdf-datasets/mnist/",
            Dataset::Fashion => "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        }
    }

    pub fn class_names(self) -> [&'static str; 10] {
        match self {
            Dataset::Mnist => ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"],
            Dataset::Fashion => [
                "T-shirt/top",
                "Trouser",
                "Pullover",
                "Dress",
                "Coat",
                "Sandal",
                "Shirt",
                "Sneaker",
                "Bag",
                "Ankle boot",
            ],
        }
    }

    /// The directories searched when no `--data` is given, in order.
    pub fn search_dirs(self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(root) = std::env::var_os("TEXTNET_DATA").filter(|v| !v.is_empty()).map(PathBuf::from) {
            if self == Dataset::Mnist {
                dirs.push(root.clone());
            }
            dirs.push(root.join(self.dir_name()));
        }
        dirs.push(Path::new(".").join("data").join(self.dir_name()));
        dirs.extend(self.cache_dir());
        if self == Dataset::Fashion {
            dirs.push("/usr/share/datasets/fashion-mnist".into());
        }
        dirs
    }

    fn cache_dir(self) -> Option<PathBuf> {
        crate::device::cache_dir().map(|d| d.join(self.dir_name()))
    }
}

/// Both splits of a dataset and the directory they came from.
pub struct MnistData {
    pub train: Split,
    pub test: Split,
    pub dir: PathBuf,
}

/// `dir`'s copy of `file`: raw if present, else gzipped.
fn find_file(dir: &Path, file: &str) -> Option<PathBuf> {
    [dir.join(file), dir.join(format!("{file}.gz"))].into_iter().find(|p| p.is_file())
}

/// The four files in `dir`, or the names of those missing.
fn files_in(dir: &Path) -> Result<[PathBuf; 4], Vec<&'static str>> {
    let found = FILES.map(|f| find_file(dir, f));
    if found.iter().all(Option::is_some) {
        Ok(found.map(Option::unwrap))
    } else {
        Err(FILES.iter().zip(&found).filter(|(_, p)| p.is_none()).map(|(f, _)| *f).collect())
    }
}

/// Finds (or downloads) and loads `dataset`. `log` receives progress notes (downloads).
pub fn load(dataset: Dataset, data_dir: Option<&Path>, log: &dyn Fn(&str)) -> Result<MnistData> {
    let (dir, files) = locate(dataset, data_dir, log)?;
    let train = load_split(&files[0], &files[1])?;
    let test = load_split(&files[2], &files[3])?;
    Ok(MnistData { train, test, dir })
}

fn locate(dataset: Dataset, data_dir: Option<&Path>, log: &dyn Fn(&str)) -> Result<(PathBuf, [PathBuf; 4])> {
    if let Some(dir) = data_dir {
        if dir.exists() && !dir.is_dir() {
            bail!("--data {} is a file; give the directory that holds the four IDX files", dir.display());
        }
        if !dir.is_dir() {
            bail!("--data {}: no such directory", dir.display());
        }
        return files_in(dir).map(|files| (dir.to_path_buf(), files)).map_err(|missing| {
            let what = if missing.len() == FILES.len() {
                format!("no {} files there; it needs {}", dataset.title(), FILES.join(", "))
            } else {
                format!("{} not found there", missing.join(", "))
            };
            anyhow::anyhow!("--data {}: {what} (each raw or .gz)", dir.display())
        });
    }
    let searched = dataset.search_dirs();
    if let Some((dir, files)) = searched.iter().find_map(|d| files_in(d).ok().map(|f| (d.clone(), f))) {
        return Ok((dir, files));
    }
    let why = match dataset.cache_dir() {
        Some(cache) => match download(dataset, &cache, log) {
            Ok(()) => match files_in(&cache) {
                Ok(files) => return Ok((cache, files)),
                Err(missing) => format!("the download left {} missing", missing.join(", ")),
            },
            Err(e) => format!("{e:#}"),
        },
        None => "no cache directory to download into".into(),
    };
    let places = searched.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");
    let apt = if dataset == Dataset::Fashion { " (Debian/Ubuntu: apt-get install dataset-fashion-mnist)" } else { "" };
    bail!(
        "{} not found: put {} (raw or .gz) in one of {places}{apt}, or pass --data DIR; downloading from {} failed: {why}",
        dataset.title(),
        FILES.join(", "),
        dataset.mirror()
    )
}

/// Fetches the missing gzipped files into `dir` with curl; each lands under a temporary name first, so
/// an interrupted download never looks like a complete file.
fn download(dataset: Dataset, dir: &Path, log: &dyn Fn(&str)) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for file in FILES.iter().filter(|f| find_file(dir, f).is_none()) {
        let url = format!("{}{file}.gz", dataset.mirror());
        let target = dir.join(format!("{file}.gz"));
        let part = dir.join(format!(".{file}.gz.part-{}", std::process::id()));
        log(&format!("downloading {url} → {}", target.display()));
        let output = Command::new("curl")
            .args(["--fail", "--silent", "--show-error", "--location", "--connect-timeout", "10", "--max-time", "600"])
            .arg("--output")
            .arg(&part)
            .arg(&url)
            .output();
        let failure = match output {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("curl is not installed".to_string()),
            Err(e) => Some(format!("cannot run curl: {e}")),
            Ok(out) if !out.status.success() => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                Some(stderr.lines().last().unwrap_or("curl failed").trim().to_string())
            }
            Ok(_) => None,
        };
        if let Some(why) = failure {
            let _ = std::fs::remove_file(&part);
            bail!("{why}");
        }
        std::fs::rename(&part, &target).with_context(|| format!("cannot move the download to {}", target.display()))?;
    }
    Ok(())
}
