//! How far the CPU reference moves on its own over the selftest's "4 distinct tokens" training check:
//! for each of `problems` random problems of that check's kind (V = 2003, D = 32, H = 64, context 3, a
//! stream of four distinct tokens, `batch` samples a step, 1000 steps, lr 0.1), the run against the same
//! run with lr moved by one ulp, as the worst relative error over the loss and the parameters. That
//! re-rounds every update by about as much as a different summation order does (a relative 1e-7); where a
//! hidden unit sits at ReLU's kink for a context, the rounding decides whether a step updates the unit, and
//! the runs part by far more than that. `textnet selftest`'s training checks draw their problem again when
//! this spread is above 1e-4.
//!
//! usage: cargo run --release --example training_check_spread -- [problems (default 400)] [batch (default 7)]

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use textnet::text::model::{TextParams, TextShape};
use textnet::text::{CpuTrainer, TextTrainer};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let problems: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(400);
    let batch: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(7);
    if problems == 0 || batch == 0 {
        anyhow::bail!("problems and batch must be at least 1");
    }
    let s = TextShape { vocab: 2003, embed: 32, hidden: 64, context: 3 };
    let mut spreads = Vec::new();
    for seed in 0..problems {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut p = TextParams::init(s, rng.random());
        p.embedding.iter_mut().for_each(|e| *e *= 0.1);
        p.b1.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
        p.b2.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
        let len = 4 + s.context + 64;
        let pool: Vec<u32> = (0..4).map(|_| rng.random_range(0..s.vocab as u32)).collect();
        let tokens: Arc<[u32]> = (0..len).map(|_| pool[rng.random_range(0..4)]).collect();
        let positions: Vec<u32> = (0..1000 * batch).map(|_| rng.random_range(s.context as u32..len as u32)).collect();
        let run = |lr: f32| -> Result<(TextParams, f64)> {
            let mut cpu = CpuTrainer { params: p.clone(), tokens: tokens.clone() };
            let loss = cpu.train(&positions, batch, lr)?;
            Ok((cpu.params, loss))
        };
        let ((a, loss_a), (b, loss_b)) = (run(0.1)?, run(f32::from_bits(0.1f32.to_bits() + 1))?);
        let loss_spread = ("loss", textnet::selftest::rel_error(&[loss_b as f32], &[loss_a as f32]));
        let (name, spread) = textnet::selftest::param_rel_errors(&b, &a)
            .into_iter()
            .chain([loss_spread])
            .fold(("", 0.0f64), |worst, e| if e.1 > worst.1 { e } else { worst });
        println!("problem {seed}: worst {name} {spread:.3e}");
        spreads.push(spread);
    }
    spreads.sort_by(f64::total_cmp);
    let above = spreads.iter().filter(|&&x| x > 1e-3).count();
    println!(
        "{problems} problems, B = {batch}: median spread {:.1e}, largest {:.1e}, {above} above 1e-3",
        spreads[spreads.len() / 2],
        spreads[spreads.len() - 1]
    );
    Ok(())
}
