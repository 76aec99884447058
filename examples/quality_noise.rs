//! How far apart runs of the same single-sample SGD end when their arithmetic differs only in rounding:
//! the CPU reference of `textnet bench quality`, once as is and once per perturbation, which is
//! either one W2 weight moved by one ulp at the start (`weight`) or the learning rate moved by k ulps
//! (`lr`: a relative change of ~1e-7 that re-rounds every update of every step, as a different summation
//! order does). Prints each run's validation loss: the noise under any GPU / CPU / PyTorch comparison of
//! that benchmark's validation loss.
//!
//! With 0 perturbations it prints the CPU reference's validation loss for `seed`, the number to set beside
//! `textnet bench quality --seed N --no-cpu` and PyTorch's.
//!
//! usage: cargo run --release --example quality_noise -- [perturbations (default 3)] [weight|lr] [corpus] [seed (default 1)]

use anyhow::{Result, bail};
use textnet::text::bench::{QUALITY_LR, QualityRun};
use textnet::text::{CpuTrainer, TextTrainer};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let perturbations: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let kind = args.next().unwrap_or_else(|| "lr".into());
    if kind != "lr" && kind != "weight" {
        bail!("the perturbation is `lr` or `weight`, not {kind:?}");
    }
    let corpus = args.next().unwrap_or_else(|| "corpus/shakespeare.txt".into());
    let seed: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let run = QualityRun::new(corpus.as_ref(), 20_000, seed)?;
    let runs: Vec<_> = (0..=perturbations)
        .map(|k| {
            let (mut params, mut lr) = (run.params.clone(), QUALITY_LR);
            let what = match (k, kind.as_str()) {
                (0, _) => "as is".to_string(),
                (_, "weight") => {
                    let i = (k * 1_000_003) % params.w2.len();
                    params.w2[i] = f32::from_bits(params.w2[i].to_bits() + 1);
                    format!("W2[{i}] + 1 ulp")
                }
                _ => {
                    lr = f32::from_bits(lr.to_bits() + k as u32);
                    format!("lr + {k} ulp ({lr:e})")
                }
            };
            let (tokens, order, val) = (run.tokens.clone(), run.order.clone(), run.val.clone());
            std::thread::spawn(move || -> Result<(String, f64)> {
                let mut cpu = CpuTrainer::new(params, tokens);
                cpu.train(&order, 1, lr)?;
                let e = cpu.evaluate(&val)?;
                Ok((what, e.loss / e.samples as f64))
            })
        })
        .collect();
    for r in runs {
        let (what, loss) = r.join().expect("a run panicked")?;
        println!("{what:<28} val loss {loss:.4}");
    }
    Ok(())
}
