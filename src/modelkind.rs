//! What a textnet model file is, read from its metadata alone, so that a command given the wrong kind
//! can say what the file is and which command takes it instead of only that it is not its own kind.

use std::collections::HashMap;

/// A kind of model file: the tag in its metadata (`format`, or `kind` in the files that name it so),
/// what it is, and the command that uses it.
struct Kind {
    tag: &'static str,
    what: &'static str,
    used_by: &'static str,
}

const KINDS: &[Kind] = &[
    Kind { tag: "textnet-text", what: "a next-token text model", used_by: "textnet predict, generate or eval" },
    Kind { tag: "textnet-transformer", what: "a character-level Transformer", used_by: "textnet generate" },
    Kind { tag: "textnet-mnist", what: "an MNIST MLP classifier", used_by: "textnet classify" },
    Kind { tag: "textnet-mnist-cnn", what: "an MNIST CNN classifier", used_by: "textnet mnist --model cnn" },
    Kind { tag: "xor", what: "an XOR network", used_by: "textnet xor" },
    Kind { tag: "sales", what: "a sales (table) regressor", used_by: "textnet sales --model" },
];

/// "… is an XOR network (see textnet xor)" for a safetensors file of another kind of textnet model, or
/// None when its metadata names no kind textnet knows.
pub fn describe(metadata: Option<&HashMap<String, String>>) -> Option<String> {
    let meta = metadata?;
    let tag = meta.get("format").or_else(|| meta.get("kind"))?;
    let kind = KINDS.iter().find(|k| k.tag == tag)?;
    Some(format!("it is {} (for {})", kind.what, kind.used_by))
}
