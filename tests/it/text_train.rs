//! Training on the CPU reference: a slice of the committed Shakespeare corpus beats the unigram
//! baseline; runs are reproducible from the seed; a diverging run hands back its last good parameters;
//! and a trained model predicts the same after a trip through its file.

use crate::common::text::shakespeare;
use std::sync::Arc;
use textnet::ops::optim::{LrSchedule, LrScheduleKind};
use textnet::text::corpus::{Corpus, CorpusOptions, Split};
use textnet::text::model::EvalSums;
use textnet::text::model::{TextParams, TextShape};
use textnet::text::modelfile::TextModel;
use textnet::text::predict::predict;
use textnet::text::tokenizer::Tokenizer;
use textnet::text::train::{EpochMetrics, Progress, TrainOptions, TrainRun, train, unigram_loss};
use textnet::text::{CpuTrainer, TextTrainer};

struct Setup {
    corpus: Corpus,
    split: Split,
    shape: TextShape,
}

fn setup(max_tokens: usize) -> Setup {
    let options = CorpusOptions { tokenizer: Tokenizer::default(), max_vocab: 300, max_tokens: Some(max_tokens) };
    let corpus = Corpus::read(&shakespeare(), options).unwrap();
    let split = Split::new(corpus.tokens.len(), 3).unwrap();
    let shape = TextShape { vocab: corpus.vocab.len(), embed: 16, hidden: 32, context: 3 };
    Setup { corpus, split, shape }
}

fn run(s: &Setup, options: TrainOptions, progress: &mut dyn Progress) -> TrainRun {
    let tokens: Arc<[u32]> = s.corpus.tokens.clone().into();
    let mut trainer = CpuTrainer::new(TextParams::init(s.shape, options.seed), tokens);
    train(&mut trainer, &s.split.train, &s.split.val, &options, progress).unwrap()
}

const CONSTANT: LrSchedule = LrSchedule { kind: LrScheduleKind::Constant, warmup: 0, min_lr: 0.0 };
const OPTIONS: TrainOptions =
    TrainOptions { lr: 0.05, schedule: CONSTANT, epochs: 2, batch: 1, seed: 5, shuffle: true };

/// Counts what the hooks report.
#[derive(Default)]
struct Counter {
    started: Vec<usize>,
    advanced: usize,
    finished: Vec<usize>,
}

impl Progress for Counter {
    fn epoch_started(&mut self, epoch: usize, samples: usize) {
        self.started.push(epoch);
        assert!(samples > 0);
    }
    fn advanced(&mut self, samples: usize) {
        self.advanced += samples;
    }
    fn epoch_finished(&mut self, metrics: &EpochMetrics) {
        self.finished.push(metrics.epoch);
    }
}

#[test]
fn training_beats_the_unigram_baseline_and_predicts_the_same_after_saving() {
    let s = setup(40_000);
    assert_eq!(s.corpus.vocab.len(), 300);
    let unigram = unigram_loss(&s.corpus.tokens, s.split.val_start, s.shape.vocab, &s.split.val);
    let mut counter = Counter::default();
    let result = run(&s, OPTIONS, &mut counter);
    assert!(result.diverged.is_none());
    assert_eq!((counter.started, counter.finished), (vec![1, 2], vec![1, 2]));
    assert_eq!(counter.advanced, 2 * s.split.train.len());

    let [first, last] = &result.epochs[..] else { panic!("{:?}", result.epochs) };
    assert!(last.train_loss < first.train_loss, "{first:?} → {last:?}");
    assert!(last.val_loss < unigram - 0.1, "val loss {} vs unigram {unigram}", last.val_loss);
    assert!((last.val_perplexity - last.val_loss.exp()).abs() < 1e-9);
    assert!(last.top1 > 0.05 && last.top5 >= last.top1 && last.top5 <= 1.0);
    assert!(last.samples_per_s > 0.0 && last.elapsed_s > 0.0);

    let model = TextModel { params: result.params, tokenizer: Tokenizer::default(), vocab: s.corpus.vocab.clone() };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    model.save(&path).unwrap();
    let loaded = TextModel::load(&path).unwrap();
    let everything = s.shape.vocab;
    for context in ["to be or", "my lord", "I pray you ,", "xyzzy the king"] {
        let before = predict(&model, context, everything, true).unwrap();
        let after = predict(&loaded, context, everything, true).unwrap();
        assert_eq!(before, after, "{context}");
        let total: f32 = after.top.iter().map(|c| c.probability).sum();
        assert!((total - 1.0).abs() < 1e-4, "{context}: probabilities sum to {total}");
    }
}

#[test]
fn the_seed_decides_the_run() {
    let s = setup(3_000);
    let options = TrainOptions { epochs: 1, ..OPTIONS };
    let a = run(&s, options, &mut ());
    let b = run(&s, options, &mut ());
    assert_eq!(a.params, b.params);
    assert_eq!(a.epochs[0].val_loss, b.epochs[0].val_loss);
    let unshuffled = run(&s, TrainOptions { shuffle: false, ..options }, &mut ());
    assert_ne!(a.params, unshuffled.params);
    let other_seed = run(&s, TrainOptions { seed: 6, ..options }, &mut ());
    assert_ne!(a.params, other_seed.params);
}

#[test]
fn batches_larger_than_one_train_too() {
    let s = setup(3_000);
    let result = run(&s, TrainOptions { batch: 7, lr: 0.2, epochs: 2, ..OPTIONS }, &mut ());
    assert!(result.diverged.is_none());
    assert!(result.epochs[1].train_loss < result.epochs[0].train_loss);
}

#[test]
fn divergence_keeps_the_last_good_parameters() {
    let s = setup(3_000);
    let initial = TextParams::init(s.shape, OPTIONS.seed);
    let result = run(&s, TrainOptions { lr: 1e9, epochs: 3, ..OPTIONS }, &mut ());
    let divergence = result.diverged.expect("lr 1e9 must diverge");
    assert_eq!(divergence.epoch, 1);
    assert!(result.epochs.is_empty());
    assert_eq!(result.params, initial);
}

/// A trainer that only records the rate of every step it is asked to take.
struct RateRecorder {
    params: TextParams,
    rates: Vec<f32>,
}

impl TextTrainer for RateRecorder {
    fn train_steps(&mut self, positions: &[u32], batch: usize, rates: &[f32]) -> anyhow::Result<f64> {
        assert_eq!(rates.len(), positions.len().div_ceil(batch));
        self.rates.extend(rates);
        Ok(positions.len() as f64)
    }
    fn evaluate(&mut self, positions: &[u32]) -> anyhow::Result<EvalSums> {
        Ok(EvalSums { samples: positions.len() as u64, loss: positions.len() as f64, top1: 0, top5: 0 })
    }
    fn params(&mut self) -> anyhow::Result<TextParams> {
        Ok(self.params.clone())
    }
}

/// Over chunks and epochs, step k of the run is at the schedule's rate k of the run's steps.
#[test]
fn every_step_is_at_its_rate_of_the_schedule() {
    let shape = TextShape { vocab: 5, embed: 2, hidden: 2, context: 1 };
    // 1000 samples in steps of 3: 334 steps an epoch (the last of one sample), in chunks of 3 to 258.
    let positions: Vec<u32> = (1..1001).collect();
    for schedule in [
        LrSchedule { kind: LrScheduleKind::Cosine, warmup: 50, min_lr: 0.01 },
        LrSchedule { kind: LrScheduleKind::Step, warmup: 0, min_lr: 0.0 },
        LrSchedule { warmup: 400, ..CONSTANT },
        CONSTANT,
    ] {
        let mut trainer = RateRecorder { params: TextParams::init(shape, 1), rates: Vec::new() };
        let options = TrainOptions { lr: 0.5, schedule, epochs: 3, batch: 3, ..OPTIONS };
        train(&mut trainer, &positions, &[1, 2], &options, &mut ()).unwrap();
        assert_eq!(trainer.rates, schedule.rates(0.5, 3 * 334), "{schedule:?}");
    }
}

/// A trainer that records the positions it is asked to train on, with a loss of NaN from chunk `nan_at`.
struct OrderRecorder {
    params: TextParams,
    chunks: Vec<Vec<u32>>,
    nan_at: Option<usize>,
}

impl TextTrainer for OrderRecorder {
    fn train_steps(&mut self, positions: &[u32], _batch: usize, _rates: &[f32]) -> anyhow::Result<f64> {
        self.chunks.push(positions.to_vec());
        Ok(if Some(self.chunks.len() - 1) == self.nan_at { f64::NAN } else { positions.len() as f64 })
    }
    fn evaluate(&mut self, positions: &[u32]) -> anyhow::Result<EvalSums> {
        Ok(EvalSums { samples: positions.len() as u64, loss: positions.len() as f64, top1: 0, top5: 0 })
    }
    fn params(&mut self) -> anyhow::Result<TextParams> {
        Ok(self.params.clone())
    }
}

/// Without a shuffle every epoch trains on the positions in their order; with one, each epoch on a
/// permutation of them (another each epoch); a chunk whose loss is not finite ends the epoch there.
#[test]
fn epochs_train_in_order_or_shuffled_and_stop_at_a_non_finite_chunk() {
    let shape = TextShape { vocab: 5, embed: 2, hidden: 2, context: 1 };
    let positions: Vec<u32> = (1..701).collect();
    let recorder = |nan_at| OrderRecorder { params: TextParams::init(shape, 1), chunks: Vec::new(), nan_at };
    let epochs_of =
        |r: &OrderRecorder| -> Vec<Vec<u32>> { r.chunks.concat().chunks(700).map(<[u32]>::to_vec).collect() };
    let options = TrainOptions { epochs: 2, batch: 4, ..OPTIONS };

    let mut ordered = recorder(None);
    train(&mut ordered, &positions, &[1, 2], &TrainOptions { shuffle: false, ..options }, &mut ()).unwrap();
    assert_eq!(epochs_of(&ordered), vec![positions.clone(), positions.clone()]);

    let mut shuffled = recorder(None);
    train(&mut shuffled, &positions, &[1, 2], &options, &mut ()).unwrap();
    let epochs = epochs_of(&shuffled);
    assert_eq!(epochs.len(), 2);
    assert!(epochs[0] != positions && epochs[1] != positions && epochs[0] != epochs[1]);
    for epoch in &epochs {
        let mut sorted = epoch.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, positions);
    }

    let mut diverging = recorder(Some(1));
    let result = train(&mut diverging, &positions, &[1, 2], &options, &mut ()).unwrap();
    assert_eq!(diverging.chunks.len(), 2, "no chunk after the one whose loss is NaN");
    assert_eq!(result.diverged.map(|d| (d.epoch, d.what)), Some((1, "training loss")));
    assert!(result.epochs.is_empty());
}
