//! The flags of data-parallel training, shared by the training commands that offer it: `--gpus` (several
//! GPUs of this host from one process) or `--world-size W --rank R --rendezvous HOST:PORT` (one process per
//! GPU, on one host or several). Checked here without touching any hardware; `Plan` says what they ask,
//! and `Plan::open` opens it: the GPUs, the rendezvous of a multi-process run, and the NCCL communicators
//! that connect the replicas.

use crate::device::nccl::{self, Comm};
use crate::device::rendezvous::{self, Rendezvous, Watch};
use crate::device::{self, Backend, DeviceChoice, Gpu};
use anyhow::{Context, Result, bail};
use std::sync::Arc;
use std::time::Duration;

/// How long the ranks of a multi-process run wait for each other at the rendezvous.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// The long names of the data-parallel flags (`ParallelArgs`), for the usage error of a command that has
/// none of them.
pub const FLAGS: [&str; 4] = ["gpus", "world-size", "rank", "rendezvous"];

/// The data-parallel flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ParallelArgs {
    /// Train on several GPUs of this host, data-parallel over NCCL: a count (the first N) or a list of
    /// GPU numbers (0,2). --batch is then the global batch, split evenly between them. With --world-size:
    /// the number of this process's one GPU (default: its rank modulo this host's GPU count)
    #[arg(long, value_name = "N|LIST")]
    pub gpus: Option<String>,
    /// Train as one of W processes, one GPU each, on this host or several (with --rank and --rendezvous);
    /// --batch is the global batch over all of them
    #[arg(long, value_name = "W")]
    pub world_size: Option<usize>,
    /// This process's rank, 0 to W − 1; rank 0 writes the model and the report
    #[arg(long, value_name = "R")]
    pub rank: Option<usize>,
    /// Where rank 0 listens for the others (HOST:PORT, reachable from every host)
    #[arg(long, value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,
}

/// What the flags ask for.
#[derive(Debug)]
pub enum Plan {
    /// One GPU (or the CPU), as without these flags.
    One,
    /// These GPUs of this host, driven by this process.
    Local(Vec<usize>),
    /// One rank of a multi-process run.
    Rank {
        /// Where and as whom it meets the others.
        rendezvous: Rendezvous,
        /// The GPU named by --gpus; else GPU rank mod this host's count.
        gpu: Option<usize>,
    },
}

impl Plan {
    /// The number of replicas over the whole run.
    pub fn replicas(&self) -> usize {
        match self {
            Plan::One => 1,
            Plan::Local(gpus) => gpus.len(),
            Plan::Rank { rendezvous, .. } => rendezvous.world_size,
        }
    }

    /// Whether this process writes the model and the report: all but the ranks other than 0.
    pub fn writes(&self) -> bool {
        !matches!(self, Plan::Rank { rendezvous, .. } if rendezvous.rank != 0)
    }
}

impl Plan {
    /// Opens what the plan trains on. `Plan::One` resolves `--device` as every command does; the others
    /// load NCCL and open their GPUs, and a rank first meets the others, comparing `fingerprint()` (what
    /// every rank must have been started with alike), after `announce` has been given the line that says
    /// whom it waits for (`Rendezvous::waiting`).
    pub fn open(
        &self,
        device: DeviceChoice,
        fingerprint: impl FnOnce() -> String,
        announce: impl FnOnce(&str),
    ) -> Result<Opened> {
        if !matches!(self, Plan::One) && device == DeviceChoice::Cpu {
            bail!("--gpus and --world-size train on GPUs: leave out --device cpu");
        }
        let (gpus, first_rank, line, watch, id) = match self {
            Plan::One => {
                let (backend, line) = device::select_described(device)?;
                return Ok(Opened {
                    backend,
                    line,
                    gpus: Vec::new(),
                    first_rank: 0,
                    world_size: 1,
                    watch: None,
                    id: None,
                });
            }
            Plan::Local(ordinals) => {
                nccl::version().context("--gpus")?;
                let listed = ordinals.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
                let gpus = ordinals
                    .iter()
                    .map(|&o| Gpu::open(o).map(Arc::new).with_context(|| format!("--gpus {listed}")))
                    .collect::<Result<Vec<_>>>()?;
                (gpus, 0, format!("{} GPUs: {listed}", ordinals.len()), None, None)
            }
            Plan::Rank { rendezvous, gpu } => {
                nccl::version().context("--world-size")?;
                let ordinal = match gpu {
                    Some(g) => *g,
                    None => rendezvous.rank % device::gpu_count().context("--world-size")?.max(1),
                };
                if let Some(line) = rendezvous.waiting() {
                    announce(&line);
                }
                let meeting = rendezvous.meet(crate::VERSION, &fingerprint(), nccl::unique_id)?;
                let gpu = Gpu::open(ordinal).with_context(|| format!("rank {}: GPU {ordinal}", rendezvous.rank))?;
                let line = format!("rank {} of {}, GPU {ordinal}", rendezvous.rank, rendezvous.world_size);
                let id = meeting.id.clone();
                let watch = meeting.watch(rendezvous.rank, rendezvous::exit_on_gone);
                (vec![Arc::new(gpu)], rendezvous.rank, line, Some(watch), Some(id))
            }
        };
        let backend = Backend::Cuda(gpus[0].clone());
        let line = format!("{} ({line})", backend.describe());
        Ok(Opened { backend, line, gpus, first_rank, world_size: self.replicas(), watch, id })
    }
}

/// What `Plan::open` opened.
pub struct Opened {
    /// The device of the run (its first GPU's, with several).
    pub backend: Backend,
    /// The device as the command's `device:` line describes it.
    pub line: String,
    /// This process's GPUs for data parallelism; empty for `Plan::One`.
    pub gpus: Vec<Arc<Gpu>>,
    /// The global rank of `gpus[0]`, and the number of replicas over the run.
    pub first_rank: usize,
    /// The number of replicas over the run.
    pub world_size: usize,
    /// A rank's watch over its links to the others, to `finish` at the run's normal end (dropped, it
    /// stops the others).
    pub watch: Option<Watch>,
    /// A rank's NCCL id of the run, from the rendezvous.
    id: Option<Vec<u8>>,
}

impl Opened {
    /// The NCCL communicators of `gpus`, in order: all made here (`--gpus`), or this rank's, joined over
    /// the rendezvous's id (returns once every rank has joined).
    pub fn comms(&self) -> Result<Vec<Comm>> {
        match &self.id {
            None => Comm::all_local(&self.gpus.iter().map(|g| g.ctx.ordinal()).collect::<Vec<_>>()),
            Some(id) => {
                self.gpus[0].ctx.bind_to_thread()?;
                Ok(vec![Comm::join(self.world_size, self.first_rank, id)?])
            }
        }
    }
}

impl ParallelArgs {
    /// Checks the flags' values and how they go together, and that `batch` splits evenly.
    pub fn plan(&self, batch: usize) -> Result<Plan> {
        let plan = match (self.world_size, self.rank, self.rendezvous.as_deref()) {
            (None, None, None) => self.gpus.as_deref().map(parse_gpus).transpose()?.map_or(Plan::One, Plan::Local),
            (Some(world), Some(rank), Some(address)) => {
                // Here --gpus is a GPU's number, not a count.
                let gpu = match self.gpus.as_deref().map(|g| g.trim().parse::<usize>()) {
                    None => None,
                    Some(Ok(one)) => Some(one),
                    Some(Err(_)) => bail!("with --world-size, --gpus names this process's one GPU (e.g. --gpus 1)"),
                };
                Plan::Rank { rendezvous: Rendezvous::new(world, rank, address, RENDEZVOUS_TIMEOUT)?, gpu }
            }
            _ => bail!("--world-size, --rank and --rendezvous go together: give all three, or none"),
        };
        let n = plan.replicas();
        if !batch.is_multiple_of(n) {
            bail!("--batch {batch} does not split evenly over {n} GPUs: give a multiple of {n}");
        }
        Ok(plan)
    }
}

/// `--gpus`: a count N (GPUs 0 … N − 1) or a comma-separated list of GPU numbers, each once.
fn parse_gpus(text: &str) -> Result<Vec<usize>> {
    let bad = || anyhow::anyhow!("--gpus {text}: expected a count (2) or a list of GPU numbers (0,1)");
    if !text.contains(',') {
        let n: usize = text.trim().parse().map_err(|_| bad())?;
        if n == 0 {
            bail!("--gpus must be at least 1, got 0");
        }
        return Ok((0..n).collect());
    }
    let list: Vec<usize> =
        text.split(',').map(|g| g.trim().parse::<usize>().map_err(|_| bad())).collect::<Result<_>>()?;
    if let Some(g) = list.iter().enumerate().find(|(i, g)| list[..*i].contains(g)).map(|(_, g)| g) {
        bail!("--gpus {text}: GPU {g} is named twice");
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(gpus: Option<&str>, world: Option<usize>, rank: Option<usize>, at: Option<&str>) -> ParallelArgs {
        ParallelArgs { gpus: gpus.map(str::to_string), world_size: world, rank, rendezvous: at.map(str::to_string) }
    }

    fn error(a: ParallelArgs, batch: usize) -> String {
        format!("{:#}", a.plan(batch).unwrap_err())
    }

    #[test]
    fn gpus_are_a_count_or_a_list() {
        assert!(matches!(args(None, None, None, None).plan(64).unwrap(), Plan::One));
        assert!(matches!(args(Some("2"), None, None, None).plan(64).unwrap(), Plan::Local(g) if g == [0, 1]));
        assert!(matches!(args(Some("1,3"), None, None, None).plan(64).unwrap(), Plan::Local(g) if g == [1, 3]));
        assert_eq!(error(args(Some("0"), None, None, None), 64), "--gpus must be at least 1, got 0");
        assert_eq!(
            error(args(Some("two"), None, None, None), 64),
            "--gpus two: expected a count (2) or a list of GPU numbers (0,1)"
        );
        assert_eq!(error(args(Some("1,1"), None, None, None), 64), "--gpus 1,1: GPU 1 is named twice");
    }

    #[test]
    fn the_batch_splits_evenly() {
        assert_eq!(
            error(args(Some("4"), None, None, None), 30),
            "--batch 30 does not split evenly over 4 GPUs: give a multiple of 4"
        );
        assert_eq!(
            error(args(None, Some(3), Some(0), Some("h:1")), 64),
            "--batch 64 does not split evenly over 3 GPUs: give a multiple of 3"
        );
    }

    #[test]
    fn the_rank_flags_go_together() {
        let together = "--world-size, --rank and --rendezvous go together: give all three, or none";
        assert_eq!(error(args(None, Some(2), None, None), 64), together);
        assert_eq!(error(args(None, Some(2), Some(1), None), 64), together);
        assert_eq!(error(args(None, None, None, Some("h:1")), 64), together);
        assert_eq!(
            error(args(Some("0,1"), Some(2), Some(1), Some("h:1")), 64),
            "with --world-size, --gpus names this process's one GPU (e.g. --gpus 1)"
        );
        assert_eq!(error(args(None, Some(2), Some(2), Some("h:1")), 64), "--rank 2 is not below --world-size 2");
        let plan = args(Some("1"), Some(2), Some(1), Some("h:1")).plan(64).unwrap();
        assert!(matches!(&plan, Plan::Rank { gpu: Some(1), .. }));
        assert!(!plan.writes());
        assert!(args(None, Some(2), Some(0), Some("h:1")).plan(64).unwrap().writes());
    }

    #[test]
    fn the_flags_listed_are_the_flags_parsed() {
        let command = <ParallelArgs as clap::Args>::augment_args(clap::Command::new("t"));
        let parsed: Vec<&str> = command.get_arguments().filter_map(clap::Arg::get_long).collect();
        assert_eq!(parsed, FLAGS);
    }
}
