//! `examples/nanogpt.rs` (nanoGPT written with `nn`) run on the CPU at a tiny size, as its own `main`
//! runs it: the example's code compiled into this crate, so a change to `nn` that breaks the example's
//! model or loop fails here and not only on a GPU.

#[path = "../../examples/nanogpt.rs"]
#[allow(dead_code)]
mod nanogpt;

use clap::Parser;

#[test]
fn nanogpt_example_trains_a_tiny_model_on_the_cpu() {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/tinyshakespeare.txt");
    let flags = "--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 8 --max-iters 60 --warmup-iters 5 \
                 --eval-interval 30 --eval-iters 4 --dropout 0.1 --learning-rate 3e-3";
    let args = nanogpt::Args::parse_from(["nanogpt", corpus].into_iter().chain(flags.split_whitespace()));
    let outcome = nanogpt::run(&args).unwrap();
    // The first evaluation is near ln(65) ≈ 4.17 (uniform over the characters); 60 steps learn the
    // characters' frequencies at least.
    assert!((outcome.first_val - 65f32.ln()).abs() < 0.3, "first validation loss {}", outcome.first_val);
    assert!(outcome.best_val < outcome.first_val - 0.8, "{} → {}", outcome.first_val, outcome.best_val);
}

#[test]
fn nanogpt_example_refuses_bad_settings_in_one_line() {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/tinyshakespeare.txt");
    let run = |flags: &str| {
        let args = nanogpt::Args::parse_from(["nanogpt", corpus].into_iter().chain(flags.split_whitespace()));
        nanogpt::run(&args).map(|_| ()).unwrap_err().to_string()
    };
    assert_eq!(run("--n-embd 30 --n-head 4"), "--n-embd 30 is not a multiple of --n-head 4");
    assert_eq!(run("--device tpu"), "--device must be cpu or cuda, not tpu");
    assert_eq!(run("--precision bf16"), "--precision bf16 needs --device cuda");
}
