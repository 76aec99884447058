//! The character-level Transformer as an ONNX model, the CPU reference's forward pass (`model`, no
//! dropout) operator by operator. Input `input_ids`: int64 `[batch, sequence]`, the vocabulary's ids
//! (`sequence` at most `block`); output `logits`: `[batch, sequence, vocab]`, each position's scores for
//! the next character.
//!
//! ```text
//! x = Gather(tok_emb, ids) + pos_emb[:sequence]
//! per block: a = LayerNormalization(x);  q, k, v = a·W_qᵀ + b_q, …  (W_qkv cut in three), as [batch, head, t, hs]
//!            p = Softmax(q·kᵀ · 1/√hs + mask[:sequence, :sequence]);  x = x + (p·v, heads joined)·W_projᵀ + b_proj
//!            x = x + gelu(LayerNormalization(x)·W_fcᵀ + b_fc)·W_mprojᵀ + b_mproj
//! logits = LayerNormalization(x)·W_headᵀ + b_head
//! ```
//!
//! The causal mask is a `block`×`block` constant, 0 on and below the diagonal and −∞ above it, sliced to
//! the sequence's length; weights are stored transposed for `MatMul`. The vocabulary (JSON) and `block`
//! go into the metadata, so a caller can turn text into ids.

use super::model::{Config, Layout, head_weight};
use super::modelfile::TransformerModel;
use crate::io::onnx::{BATCH, Dim, Graph, float, int, ints};
use anyhow::Result;

/// The symbolic sequence-length dimension of the input and output.
const SEQUENCE: &str = "sequence";

/// The model as the bytes of an ONNX file.
pub fn export(model: &TransformerModel) -> Result<Vec<u8>> {
    let c = model.config;
    let mut graph = Graph::new();
    let writer = Writer { config: c, layout: Layout::new(&c), params: &model.params };
    let ids = graph.int_input("input_ids", &[Dim::Named(BATCH), Dim::Named(SEQUENCE)]);

    let seq_len = graph.node("Shape", &[&ids], vec![int("start", 1), int("end", 2)], "sequence_length");
    let zero = graph.int64s("zero", &[0]);
    let zeros = graph.int64s("zeros", &[0, 0]);
    let axis0 = graph.int64s("axis0", &[0]);
    let axes01 = graph.int64s("axes01", &[0, 1]);
    let tok_emb = writer.weight(&mut graph, "tok_emb.weight");
    let pos_emb = writer.weight(&mut graph, "pos_emb.weight");
    let tokens = graph.node("Gather", &[&tok_emb, &ids], vec![int("axis", 0)], "tok_emb.out");
    let positions = graph.node("Slice", &[&pos_emb, &zero, &seq_len, &axis0], vec![], "pos_emb.out");
    let mut x = graph.node("Add", &[&tokens, &positions], vec![], "embedding");

    let t = c.block;
    let mask: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = graph.weight("causal_mask", &[t, t], &mask);
    let square = graph.node("Concat", &[&seq_len, &seq_len], vec![int("axis", 0)], "mask_size");
    let mask = graph.node("Slice", &[&mask, &zeros, &square, &axes01], vec![], "causal_mask.sliced");
    let (heads, hs) = (c.heads as i64, c.head_size() as i64);
    let split = graph.int64s("heads_shape", &[0, 0, heads, hs]);
    let joined = graph.int64s("joined_shape", &[0, 0, c.embed as i64]);
    let scale = graph.weight("attention_scale", &[], &[1.0 / (c.head_size() as f32).sqrt()]);

    for l in 0..c.layers {
        let p = format!("blocks.{l}");
        let a = writer.layer_norm(&mut graph, &x, &format!("{p}.ln1"));
        let [q, k, v] = ["q", "k", "v"].map(|part| {
            let projected = writer.qkv_part(&mut graph, &a, &format!("{p}.attn"), part);
            graph.node("Reshape", &[&projected, &split], vec![], &format!("{p}.attn.{part}.heads"))
        });
        let q = graph.node("Transpose", &[&q], vec![ints("perm", &[0, 2, 1, 3])], &format!("{p}.attn.q.t"));
        let k = graph.node("Transpose", &[&k], vec![ints("perm", &[0, 2, 3, 1])], &format!("{p}.attn.k.t"));
        let v = graph.node("Transpose", &[&v], vec![ints("perm", &[0, 2, 1, 3])], &format!("{p}.attn.v.t"));
        let scores = graph.node("MatMul", &[&q, &k], vec![], &format!("{p}.attn.scores"));
        let scores = graph.node("Mul", &[&scores, &scale], vec![], &format!("{p}.attn.scaled"));
        let scores = graph.node("Add", &[&scores, &mask], vec![], &format!("{p}.attn.masked"));
        let probs = graph.node("Softmax", &[&scores], vec![int("axis", -1)], &format!("{p}.attn.probs"));
        let y = graph.node("MatMul", &[&probs, &v], vec![], &format!("{p}.attn.y"));
        let y = graph.node("Transpose", &[&y], vec![ints("perm", &[0, 2, 1, 3])], &format!("{p}.attn.y.t"));
        let y = graph.node("Reshape", &[&y, &joined], vec![], &format!("{p}.attn.y.joined"));
        let y = writer.linear(&mut graph, &y, &format!("{p}.attn.proj"));
        x = graph.node("Add", &[&x, &y], vec![], &format!("{p}.attn.residual"));

        let m = writer.layer_norm(&mut graph, &x, &format!("{p}.ln2"));
        let u = writer.linear(&mut graph, &m, &format!("{p}.mlp.fc"));
        let g = graph.gelu_tanh(&u, &format!("{p}.mlp.gelu"));
        let y = writer.linear(&mut graph, &g, &format!("{p}.mlp.proj"));
        x = graph.node("Add", &[&x, &y], vec![], &format!("{p}.mlp.residual"));
    }
    let xf = writer.layer_norm(&mut graph, &x, "ln_f");
    let head = writer.transposed(&mut graph, head_weight(&c), "head.weight.t", 0..c.vocab);
    let logits = graph.node("MatMul", &[&xf, &head], vec![], "head.out");
    let logits = match writer.bias(&mut graph, "head.bias", 0..c.vocab) {
        Some(b) => graph.node("Add", &[&logits, &b], vec![], "head.biased"),
        None => logits,
    };
    graph.output(&logits, "logits", &[Dim::Named(BATCH), Dim::Named(SEQUENCE), Dim::Fixed(c.vocab)]);

    let chars: Vec<String> = model.vocab.chars().iter().map(char::to_string).collect();
    let metadata = [("vocab", serde_json::to_string(&chars)?), ("block", c.block.to_string())];
    let doc = format!(
        "textnet character-level Transformer: {} layers, embed {}, {} heads, block {}, vocabulary {}",
        c.layers, c.embed, c.heads, c.block, c.vocab
    );
    Ok(graph.to_bytes("textnet-transformer", &doc, &metadata))
}

/// The parameters, cut by name, written as the graph's initializers.
struct Writer<'a> {
    config: Config,
    layout: Layout,
    params: &'a [f32],
}

impl Writer<'_> {
    fn values(&self, name: &str) -> Option<(&[f32], &[usize])> {
        self.layout.get(name).map(|t| (&self.params[t.range()], t.shape.as_slice()))
    }

    /// Tensor `name` as it is stored.
    fn weight(&self, graph: &mut Graph, name: &str) -> String {
        let (values, dims) = self.values(name).expect("every model has its embeddings and LayerNorm weights");
        graph.weight(name, dims, values)
    }

    /// Rows `rows` of `[out, in]` weight `name`, transposed to `[in, rows]` for `MatMul`, as `output`.
    fn transposed(&self, graph: &mut Graph, name: &str, output: &str, rows: std::ops::Range<usize>) -> String {
        let (values, dims) = self.values(name).expect("every model has its linear layers' weights");
        let inputs = dims[1];
        let n = rows.len();
        let mut t = vec![0.0f32; inputs * n];
        for (r, row) in rows.enumerate() {
            for i in 0..inputs {
                t[i * n + r] = values[row * inputs + i];
            }
        }
        graph.weight(output, &[inputs, n], &t)
    }

    /// Elements `range` of bias `name`, if the model has biases.
    fn bias(&self, graph: &mut Graph, name: &str, range: std::ops::Range<usize>) -> Option<String> {
        let (values, _) = self.values(name)?;
        let stored = if range.len() == values.len() { name.to_string() } else { format!("{name}.{}", range.start) };
        Some(graph.weight(&stored, &[range.len()], &values[range]))
    }

    /// `x·Wᵀ + b` of linear layer `layer`.
    fn linear(&self, graph: &mut Graph, x: &str, layer: &str) -> String {
        let outputs = self.values(&format!("{layer}.weight")).expect("a linear layer's weight").1[0];
        let w = self.transposed(graph, &format!("{layer}.weight"), &format!("{layer}.weight.t"), 0..outputs);
        let product = graph.node("MatMul", &[x, &w], vec![], &format!("{layer}.product"));
        match self.bias(graph, &format!("{layer}.bias"), 0..outputs) {
            Some(b) => graph.node("Add", &[&product, &b], vec![], &format!("{layer}.out")),
            None => product,
        }
    }

    /// `part` (q, k or v) of the attention's joint projection: its third of `qkv`'s rows.
    fn qkv_part(&self, graph: &mut Graph, x: &str, attn: &str, part: &str) -> String {
        let e = self.config.embed;
        let third = ["q", "k", "v"].iter().position(|p| *p == part).expect("q, k or v");
        let rows = third * e..(third + 1) * e;
        let weight = format!("{attn}.qkv.weight");
        let w = self.transposed(graph, &weight, &format!("{attn}.{part}.weight.t"), rows.clone());
        let product = graph.node("MatMul", &[x, &w], vec![], &format!("{attn}.{part}"));
        match self.bias(graph, &format!("{attn}.qkv.bias"), rows) {
            Some(b) => graph.node("Add", &[&product, &b], vec![], &format!("{attn}.{part}.biased")),
            None => product,
        }
    }

    /// LayerNorm `ln` over the last axis (ε 1e-5; without biases it only scales).
    fn layer_norm(&self, graph: &mut Graph, x: &str, ln: &str) -> String {
        let w = self.weight(graph, &format!("{ln}.weight"));
        let b = self.values(&format!("{ln}.bias")).map(|(v, d)| graph.weight(&format!("{ln}.bias"), d, v));
        let mut inputs = vec![x, w.as_str()];
        inputs.extend(b.as_deref());
        let attributes = vec![int("axis", -1), float("epsilon", crate::ops::layernorm::LN_EPS as f32)];
        graph.node("LayerNormalization", &inputs, attributes, &format!("{ln}.out"))
    }
}

/// A Transformer model file's bytes as an ONNX file's (`pipeline::OnnxExport`).
pub fn export_file(bytes: &[u8]) -> Result<Vec<u8>> {
    export(&TransformerModel::from_bytes(bytes)?)
}
