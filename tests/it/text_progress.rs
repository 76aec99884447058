//! Progress moves from the first second however slow the trainer: the first call trains one batch, each
//! next one twice as many (up to a cap), never splitting a batch.

use std::time::{Duration, Instant};
use textnet::ops::optim::LrSchedule;
use textnet::text::TextTrainer;
use textnet::text::model::{EvalSums, TextParams, TextShape};
use textnet::text::train::{Progress, TrainOptions, train};

/// A trainer that takes 2 ms a sample and records how many samples each call got.
struct Slow {
    params: TextParams,
    calls: Vec<usize>,
}

impl TextTrainer for Slow {
    fn train_steps(&mut self, positions: &[u32], _batch: usize, _rates: &[f32]) -> anyhow::Result<f64> {
        std::thread::sleep(Duration::from_millis(2) * positions.len() as u32);
        self.calls.push(positions.len());
        Ok(positions.len() as f64)
    }
    fn evaluate(&mut self, positions: &[u32]) -> anyhow::Result<EvalSums> {
        Ok(EvalSums { samples: positions.len() as u64, loss: positions.len() as f64, top1: 0, top5: 0 })
    }
    fn params(&mut self) -> anyhow::Result<TextParams> {
        Ok(self.params.clone())
    }
}

#[derive(Default)]
struct FirstAdvance {
    started: Option<Instant>,
    first: Option<Duration>,
}

impl Progress for FirstAdvance {
    fn epoch_started(&mut self, _epoch: usize, _samples: usize) {
        self.started = Some(Instant::now());
    }
    fn advanced(&mut self, _samples: usize) {
        self.first.get_or_insert_with(|| self.started.unwrap().elapsed());
    }
}

#[test]
fn the_first_progress_comes_after_one_batch() {
    let shape = TextShape { vocab: 5, embed: 2, hidden: 2, context: 1 };
    let mut trainer = Slow { params: TextParams::init(shape, 1), calls: Vec::new() };
    let positions: Vec<u32> = (1..1001).collect();
    let options =
        TrainOptions { lr: 0.1, schedule: LrSchedule::default(), epochs: 1, batch: 4, seed: 1, shuffle: true };
    let mut progress = FirstAdvance::default();
    train(&mut trainer, &positions, &[1, 2], &options, &mut progress).unwrap();
    assert_eq!(trainer.calls[0], 4, "the first call trains one batch: {:?}", trainer.calls);
    assert!(progress.first.unwrap() < Duration::from_millis(500), "first progress after {:?}", progress.first);
    let (last, whole) = trainer.calls.split_last().unwrap();
    assert!(whole.iter().all(|&n| n % 4 == 0) && *last > 0, "{:?}", trainer.calls);
    assert_eq!(trainer.calls.iter().sum::<usize>(), 1000);
    assert_eq!(&trainer.calls[..4], &[4, 8, 16, 32], "each call twice the last");
    assert!(trainer.calls.iter().all(|&n| n <= 256), "at most the cap: {:?}", trainer.calls);
}
