//! The integration tests, one crate (one link step): `common` holds the helpers, then one module per
//! subject, named after the pipeline it tests (`text_*`, `fit_*`, `mnist_*`, `xor_*`, `sales_*`,
//! `transformer_*`, `matmul_*`), the shared operations (`ops`), `nn`'s tensors and autograd (`nn_*`), the
//! command-line behaviour shared by all (`cli_*`, `model_files`), the bad-input audit's regressions
//! (`bad_input_*`), the import rule (`layering`), the docs' links and examples (`docs`), the rendezvous
//! of several processes (`rendezvous`), NVRTC (`nvrtc`) and the GPU (`gpu`, ignored without one:
//! `cargo test --release -- --ignored`).

mod common;
mod docs;
mod fit_classify;
mod fit_cli;
mod fit_model;
mod fit_spec;

mod bad_input_limits;
mod bad_input_mnist;
mod bad_input_sales;
mod bad_input_tables;
mod bad_input_text;
mod bad_input_transformer;
mod cli_eval;
mod cli_export;
mod cli_generate;
mod cli_habits;
mod cli_limits;
mod cli_messages;
mod cli_outputs;
mod cli_plot;
mod cli_predict;
mod cli_report;
mod cli_shell;
mod cli_tensorboard;
mod cli_text;
mod gpu;
mod layering;
mod matmul_cpu;
mod mnist_classify;
mod mnist_cli;
mod mnist_cnn;
mod mnist_download;
mod mnist_fashion;
mod mnist_idx;
mod mnist_model;
mod model_files;
mod nn_autograd;
mod nn_bench;
mod nn_conv_layout;
mod nn_modules;
mod nn_nanogpt;
mod nn_optim;
mod nn_transformer_ops;
mod nvrtc;
mod ops;
mod rendezvous;
mod sales_cli;
mod sales_data;
mod sales_model;
mod sales_tables;
mod text_checks;
mod text_cpu_batch;
mod text_gradcheck;
mod text_infer;
mod text_modelfile;
mod text_neighbors;
mod text_predict;
mod text_progress;
mod text_train;
mod text_vocab;
mod transformer_cli;
mod transformer_data;
mod transformer_gradcheck;
mod transformer_model;
mod transformer_modelfile;
mod xor_checks;
mod xor_cli;
mod xor_gradcheck;
