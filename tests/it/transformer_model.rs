//! The transformer's CPU reference beyond its gradients: the parameter layout and initialisation, the
//! sizes it refuses, causality, the
//! logits for generation, and training: repeatable to the bit at any thread count, and a short run on a
//! repetitive text whose loss falls clearly.

use rand::{RngExt, SeedableRng};
use textnet::ops::cpu::SeededRng;
use textnet::ops::optim::{OptimConfig, OptimKind};
use textnet::transformer::data::{Corpus, train_offsets, val_offsets, windows};
use textnet::transformer::model::{
    Config, CpuTrainer, Init, Layout, default_optim, forward, init, init_with, next_logits,
};

const TINY: Config = Config { vocab: 7, block: 5, embed: 8, heads: 2, layers: 2, bias: true, tie_weights: false };

#[test]
fn the_layout_is_pytorchs_state_dict() {
    let config = Config { layers: 1, ..TINY };
    let layout = Layout::new(&config);
    assert_eq!(
        layout.names(),
        [
            "tok_emb.weight",
            "pos_emb.weight",
            "blocks.0.ln1.weight",
            "blocks.0.ln1.bias",
            "blocks.0.attn.qkv.weight",
            "blocks.0.attn.qkv.bias",
            "blocks.0.attn.proj.weight",
            "blocks.0.attn.proj.bias",
            "blocks.0.ln2.weight",
            "blocks.0.ln2.bias",
            "blocks.0.mlp.fc.weight",
            "blocks.0.mlp.fc.bias",
            "blocks.0.mlp.proj.weight",
            "blocks.0.mlp.proj.bias",
            "ln_f.weight",
            "ln_f.bias",
            "head.weight",
            "head.bias",
        ]
    );
    let qkv = layout.get("blocks.0.attn.qkv.weight").unwrap();
    assert_eq!((qkv.shape.as_slice(), qkv.offset), (&[24, 8][..], 7 * 8 + 5 * 8 + 8 + 8));
    assert_eq!(layout.get("blocks.0.mlp.proj.weight").unwrap().shape, [8, 32]);
    let mut at = 0;
    for t in layout.tensors() {
        assert_eq!(t.offset, at, "{}", t.name);
        at += t.len();
    }
    assert_eq!(at, layout.len());
    // V·C + T·C + L·(12C² + 13C) + 2C + V·C + V: the default model over 65 characters.
    let (v, t, c, l) = (65, 64, 64, 2);
    assert_eq!(Config::new(65).param_count(), v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c + v * c + v);
    assert_eq!(Config::new(65).param_count(), 112_577);
}

#[test]
fn no_bias_drops_every_bias_and_tying_drops_the_head_weight() {
    let names = |bias, tie_weights| Layout::new(&Config { bias, tie_weights, ..TINY }).names().join(" ");
    let full = Layout::new(&TINY);
    let without = names(false, false);
    assert!(!without.contains(".bias"), "{without}");
    assert_eq!(without.split(' ').count(), full.names().iter().filter(|n| !n.ends_with(".bias")).count());
    let tied = names(true, true);
    assert!(!tied.contains("head.weight") && tied.contains("head.bias"), "{tied}");
    let (v, c) = (TINY.vocab, TINY.embed);
    assert_eq!(Config { tie_weights: true, ..TINY }.param_count(), full.len() - v * c);
    // A tied head's logits are tok_emb's rows against the final LayerNorm's output.
    let config = Config { tie_weights: true, bias: false, ..TINY };
    let params = init(&config, 3);
    let untied = Config { bias: false, ..TINY };
    let layout = Layout::new(&untied);
    let mut copied = Vec::new();
    for t in layout.tensors() {
        let from = if t.name == "head.weight" { "tok_emb.weight" } else { t.name.as_str() };
        copied.extend_from_slice(&params[Layout::new(&config).get(from).unwrap().range()]);
    }
    let tokens = [1, 4, 2, 6];
    let a = forward(&config, &params, &tokens, 1, None, None).logits;
    let b = forward(&untied, &copied, &tokens, 1, None, None).logits;
    assert_eq!(a, b);
}

#[test]
fn init_follows_the_spec() {
    let config = Config::new(50);
    let layout = Layout::new(&config);
    let p = init(&config, 7);
    assert_eq!(p, init(&config, 7));
    assert_ne!(p, init(&config, 8));
    for t in layout.tensors() {
        let v = &p[t.range()];
        if t.shape.len() == 2 {
            // GPT-2's scheme, the default: the residual projections at 0.02/√(2·layers).
            let residual = t.name.ends_with("attn.proj.weight") || t.name.ends_with("mlp.proj.weight");
            let expected = if residual { 0.02 / (2.0 * config.layers as f64).sqrt() } else { 0.02 };
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
            let std = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            assert!(
                mean.abs() < 0.1 * expected + 3.0 * expected / n.sqrt() && (std / expected - 1.0).abs() < 0.1,
                "{}: {mean} {std}",
                t.name
            );
        } else if t.name.ends_with(".weight") {
            assert!(v.iter().all(|&x| x == 1.0), "{}", t.name);
        } else {
            assert!(v.iter().all(|&x| x == 0.0), "{}", t.name);
        }
    }
}

#[test]
fn gpt2_init_scales_only_the_residual_projections() {
    let config = Config { layers: 3, ..Config::new(50) };
    let layout = Layout::new(&config);
    let (normal, gpt2) = (init_with(&config, 7, Init::Normal), init_with(&config, 7, Init::Gpt2));
    assert_eq!(gpt2, init(&config, 7), "GPT-2's scheme is the default");
    let factor = 1.0 / (2.0f32 * 3.0).sqrt();
    let mut scaled = 0;
    for t in layout.tensors() {
        let (a, b) = (&normal[t.range()], &gpt2[t.range()]);
        if t.name.ends_with("attn.proj.weight") || t.name.ends_with("mlp.proj.weight") {
            // The same draws, each times 1/√(2·layers): std 0.02/√6.
            assert!(
                a.iter().zip(b).all(|(&x, &y)| ((x / 0.02) * (0.02 * factor) - y).abs() <= 1e-6 * x.abs()),
                "{}",
                t.name
            );
            scaled += 1;
        } else {
            assert_eq!(a, b, "{}", t.name);
        }
    }
    assert_eq!(scaled, 2 * config.layers);
}

#[test]
fn sizes_are_checked_with_one_line_errors() {
    assert!(Config::new(2).validate().is_ok());
    let err = |c: Config| c.validate().unwrap_err().to_string();
    assert_eq!(
        err(Config { heads: 3, ..TINY }),
        "--heads 3 must divide --embed 8 (each head takes embed / heads dimensions)"
    );
    assert!(err(Config { vocab: 1, ..TINY }).contains("at least 2 ids"));
    assert_eq!(err(Config { block: 0, ..TINY }), "--block must be at least 1");
    assert_eq!(err(Config { embed: 0, ..TINY }), "--embed must be at least 1");
    assert_eq!(err(Config { heads: 0, ..TINY }), "--heads must be at least 1");
    assert_eq!(err(Config { layers: 0, ..TINY }), "--layers must be at least 1");
}

fn random_params(config: &Config, seed: u64) -> Vec<f64> {
    let mut rng = SeededRng::seed_from_u64(seed);
    init(config, seed).iter().map(|&v| v as f64 + rng.random_range(-0.5..0.5)).collect()
}

#[test]
fn no_position_sees_a_later_token() {
    let params = random_params(&TINY, 1);
    let tokens = [3, 1, 4, 1, 5];
    let base = forward(&TINY, &params, &tokens, 1, None, None);
    let v = TINY.vocab;
    for changed in 0..tokens.len() {
        let mut other = tokens;
        other[changed] = (other[changed] + 1) % v as u32;
        let f = forward(&TINY, &params, &other, 1, None, None);
        // Earlier positions' logits are the same to the bit; from the change on they differ.
        assert_eq!(f.logits[..changed * v], base.logits[..changed * v], "token {changed} changed an earlier position");
        assert!(f.logits[changed * v..].chunks(v).zip(base.logits[changed * v..].chunks(v)).all(|(a, b)| a != b));
    }
    // A prefix alone gives the prefix's logits; so does each sequence of a batch.
    let prefix = forward(&TINY, &params, &tokens[..3], 1, None, None);
    assert!(prefix.logits.iter().zip(&base.logits).all(|(a, b)| (a - b).abs() < 1e-12));
    let both = forward(&TINY, &params, &[tokens, [0, 6, 2, 2, 1]].concat(), 2, None, None);
    assert_eq!(both.logits[..5 * v], base.logits[..]);
    // The attention probabilities: rows sum to 1, nothing above the diagonal.
    for row in base.blocks[1].att.chunks(5).enumerate().map(|(i, r)| (i % 5, r)) {
        assert!((row.1.iter().sum::<f64>() - 1.0).abs() < 1e-12 && row.1[row.0 + 1..].iter().all(|&p| p == 0.0));
    }
}

#[test]
fn next_logits_reads_the_last_block_of_the_context() {
    let config = Config { vocab: 11, block: 6, embed: 8, heads: 2, layers: 1, bias: true, tie_weights: false };
    let params = init(&config, 3);
    let context: Vec<u32> = (0..10).map(|i| (i * 7 % 11) as u32).collect();
    let last = next_logits(&config, &params, &context);
    assert_eq!(last, next_logits(&config, &params, &context[4..]));
    let f = forward(&config, &params, &context[4..], 1, None, None);
    assert_eq!(last, f.logits[5 * 11..]);
    assert_eq!(next_logits(&config, &params, &context[..1]).len(), 11);
}

/// Training steps on a fixed stream of batches: the parameters after them and the losses.
fn train(config: Config, corpus: &Corpus, optim: OptimConfig, steps: usize, batch: usize) -> (Vec<f32>, Vec<f32>) {
    let mut trainer = CpuTrainer::new(config, init(&config, 1), optim).unwrap();
    let mut rng = SeededRng::seed_from_u64(2);
    let losses = (0..steps)
        .map(|_| {
            let offsets = train_offsets(&mut rng, corpus.train.len(), config.block, batch);
            let (inputs, targets) = windows(&corpus.train, &offsets, config.block);
            trainer.step(&inputs, &targets, batch)
        })
        .collect();
    (trainer.params, losses)
}

fn repetitive_corpus(block: usize) -> Corpus {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(40);
    Corpus::from_bytes(text.as_bytes(), "corpus", 256, block).unwrap()
}

#[test]
fn training_repeats_to_the_bit_at_any_thread_count() {
    let corpus = repetitive_corpus(8);
    let config =
        Config { vocab: corpus.vocab.len(), block: 8, embed: 16, heads: 4, layers: 2, bias: true, tie_weights: false };
    let run = || train(config, &corpus, default_optim(), 5, 6);
    let (params, losses) = run();
    assert_eq!((params.clone(), losses.clone()), run());
    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(run);
    assert!(params.iter().zip(&single.0).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(losses.iter().zip(&single.1).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// --grad-accum: a step over two micro-batches of the same windows is the step over those windows once,
/// to the bit (each micro-batch's gradient is of its share of the step's mean loss, halves that add up
/// exactly; plain SGD passes the sum on as it is), and with dropout the two micro-batches draw masks of
/// their own, so that step differs.
#[test]
fn micro_batches_sum_to_the_steps_gradient_each_with_its_own_masks() {
    let corpus = repetitive_corpus(8);
    let config =
        Config { vocab: corpus.vocab.len(), block: 8, embed: 16, heads: 4, layers: 2, bias: true, tie_weights: false };
    let sgd = OptimConfig { lr: 0.1, ..OptimConfig::new(OptimKind::Sgd) };
    let offsets = train_offsets(&mut SeededRng::seed_from_u64(3), corpus.train.len(), config.block, 3);
    let (tokens, targets) = windows(&corpus.train, &offsets, config.block);
    let step = |dropout: f32, micro_batches: usize| {
        let mut t = CpuTrainer::new(config, init(&config, 1), sgd).unwrap().with_dropout(dropout, 5);
        let repeat = |v: &[u32]| v.repeat(micro_batches);
        let loss = t.accumulated_step(&repeat(&tokens), &repeat(&targets), 3, micro_batches);
        (loss.to_bits(), t.params.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
    };
    let plain = {
        let mut t = CpuTrainer::new(config, init(&config, 1), sgd).unwrap();
        let loss = t.step(&tokens, &targets, 3);
        (loss.to_bits(), t.params.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
    };
    assert_eq!(step(0.0, 1), plain);
    assert_eq!(step(0.0, 2), plain);
    let (once, twice) = (step(0.2, 1), step(0.2, 2));
    assert_ne!(once.1, twice.1, "both micro-batches drew the same dropout masks");
}

#[test]
fn a_short_run_learns_a_repetitive_text() {
    let corpus = repetitive_corpus(16);
    let config =
        Config { vocab: corpus.vocab.len(), block: 16, embed: 32, heads: 4, layers: 2, bias: true, tie_weights: false };
    let optim = OptimConfig { lr: 3e-3, ..default_optim() };
    let offsets = val_offsets(corpus.val.len(), config.block);
    let before = CpuTrainer::new(config, init(&config, 1), optim).unwrap().val_loss(&corpus.val, &offsets);
    let started = std::time::Instant::now();
    let (params, losses) = train(config, &corpus, optim, 200, 16);
    let after = CpuTrainer::new(config, params, optim).unwrap().val_loss(&corpus.val, &offsets);
    println!(
        "200 steps in {:.2?}: training loss {:.3} → {:.3}, validation loss {before:.3} → {after:.3}",
        started.elapsed(),
        losses[0],
        losses[199]
    );
    // Uniform guessing over 29 characters costs ln 29 ≈ 3.37; the text is nearly deterministic.
    assert!((before - (config.vocab as f64).ln()).abs() < 0.1);
    assert!(after < 0.5, "validation loss {before} → {after}");
    assert!(losses[190..].iter().all(|&l| l < 0.5 * losses[0]));
}

/// ZeRO-1's shards: over any number of ranks, each parameter is updated by exactly one rank, no shard is
/// longer than `per`, and the collectives' padded length covers every rank's shard.
#[test]
fn zero_shards_cover_every_parameter_once() {
    use textnet::transformer::gpu::parallel::Shard;
    for len in [1, 2, 7, 64, 1000, 10_745_472] {
        for ranks in 1..=9 {
            let mut next = 0;
            for rank in 0..ranks {
                let shard = Shard::new(len, rank, ranks);
                let range = shard.range();
                assert!(range.is_empty() || range.start == next, "{len} over {ranks}: rank {rank} starts at {range:?}");
                assert!(range.len() <= shard.per && (rank + 1) * shard.per <= shard.padded());
                next = next.max(range.end);
            }
            assert_eq!(next, len, "{len} over {ranks}");
        }
    }
}
