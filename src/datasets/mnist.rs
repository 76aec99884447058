//! Finding the dataset on disk (and fetching MNIST when it is nowhere), then loading both splits.
//!
//! Each dataset is the same four IDX files, raw or gzipped. Without `--data DIR` the search goes
//! `$TEXTNET_DATA` (MNIST only; the files directly in it) → `$TEXTNET_DATA/<name>` → `./data/<name>` →
//! the textnet cache (`$TEXTNET_CACHE` or the user's cache dir, then `textnet/<name>`) → for
//! Fashion-MNIST the Debian package's `/usr/share/datasets/fashion-mnist`, where `<name>` is `mnist` or
//! `fashion-mnist`. When none has all four files, they are downloaded (HTTPS, through `ureq`) from a public
//! mirror into the cache and checked against their published SHA-256 sums; failing that, the error names
//! the files and the places to put them. `$TEXTNET_MNIST_MIRROR` replaces the mirror (a local copy).

use super::idx::{Split, load_split};

/// What an MNIST model's inputs are, recorded in its file: the IDX pixel bytes, row by row (28×28),
/// divided by 255.
pub const INPUT_SCALING: &str = "pixel byte / 255, row-major 28x28";
use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The four files, in the order train images, train labels, test images, test labels.
pub const FILES: [&str; 4] =
    ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
/// The `--dataset` flag: which image set to train on.
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

    /// The dataset's name for people, e.g. "Fashion-MNIST".
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

    /// Where `FILES` + ".gz" can be downloaded from: `$TEXTNET_MNIST_MIRROR`, else the public mirror.
    fn mirror(self) -> String {
        if let Some(mirror) = std::env::var_os("TEXTNET_MNIST_MIRROR").filter(|m| !m.is_empty()) {
            let mirror = mirror.to_string_lossy().into_owned();
            return if mirror.ends_with('/') { mirror } else { format!("{mirror}/") };
        }
        match self {
            Dataset::Mnist => "https://storage.googleapis.com/cvdf-datasets/mnist/",
            Dataset::Fashion => "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        }
        .to_string()
    }

    /// The published SHA-256 of each of `FILES` + ".gz", in that order.
    fn sha256(self) -> [&'static str; 4] {
        match self {
            Dataset::Mnist => [
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
            ],
            Dataset::Fashion => [
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
            ],
        }
    }

    /// The name of each class, by label.
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
        crate::device::compile::cache_dir().map(|d| d.join(self.dir_name()))
    }
}

/// Both splits of a dataset and the directory they came from.
pub struct MnistData {
    /// The training split.
    pub train: Split,
    /// The test split.
    pub test: Split,
    /// The directory the files were read from.
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
        dataset.mirror().trim_end_matches('/')
    )
}

/// Fetches the missing gzipped files into `dir`, each under a temporary name until its SHA-256 matches
/// the published one, so an interrupted or altered download never looks like a complete file. A `dir`
/// this call created is removed again when nothing could be fetched into it.
fn download(dataset: Dataset, dir: &Path, log: &dyn Fn(&str)) -> Result<()> {
    let created = !dir.exists();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = (|| -> Result<()> {
        for (file, sha256) in FILES.iter().zip(dataset.sha256()).filter(|(f, _)| find_file(dir, f).is_none()) {
            let url = format!("{}{file}.gz", dataset.mirror());
            let target = dir.join(format!("{file}.gz"));
            let part = dir.join(format!(".{file}.gz.part-{}", std::process::id()));
            log(&format!("downloading {url} → {}", target.display()));
            let fetched = fetch(&url, &part, sha256);
            if fetched.is_err() {
                let _ = std::fs::remove_file(&part);
            }
            fetched?;
            std::fs::rename(&part, &target)
                .with_context(|| format!("cannot move the download to {}", target.display()))?;
        }
        Ok(())
    })();
    if result.is_err() && created {
        let _ = std::fs::remove_dir(dir);
    }
    result
}

/// Writes the body of `url` to `path`, checking its SHA-256.
fn fetch(url: &str, path: &Path, sha256: &str) -> Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(std::time::Duration::from_secs(10)))
        .timeout_global(Some(std::time::Duration::from_secs(600)))
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let mut body = response.body_mut().with_config().limit(64 << 20).reader();
    let mut out = std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = body.read(&mut buffer).with_context(|| format!("{url}: the download broke off"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n]).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got != sha256 {
        bail!("{url}: SHA-256 {got} is not the published {sha256}; the file was not kept");
    }
    Ok(())
}
