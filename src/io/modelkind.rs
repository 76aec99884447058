//! What a textnet model file is, read from its metadata alone. Every model file names its kind in one
//! metadata entry, `format` (files written before it was unified name the XOR and sales kinds in `kind`,
//! and still load). Every command reads a file's kind here, so a command given another kind of file says
//! what the file is and which command takes it, not only that it is not its own.
//!
//! The registry is shared rather than spread over the pipelines because every command must recognise
//! every kind; each pipeline names the kinds it writes in its entry of `pipelines::ALL`, and a test checks
//! that the two agree.

use anyhow::{Result, bail};
use std::collections::HashMap;

/// A kind of model file: the tag in its metadata, the tag files written before the unified `format`
/// carried under `kind`, what it is, and the command that uses it.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// The tag under `format` in the file's metadata, e.g. "textnet-xor".
    pub tag: &'static str,
    /// The tag files written before `format` carried under `kind`, if this kind had one.
    pub legacy_tag: Option<&'static str>,
    /// What the file holds, in words for messages, e.g. "an XOR network".
    pub what: &'static str,
    /// The command that reads or writes such files, for messages.
    pub used_by: &'static str,
}

/// The metadata key that names a file's kind.
pub const KEY: &str = "format";
/// The key the XOR and sales files used before `format`.
const LEGACY_KEY: &str = "kind";

/// The next-token text model.
pub const TEXT: Kind = Kind {
    tag: "textnet-text",
    legacy_tag: None,
    what: "a next-token text model",
    used_by: "textnet predict, generate or eval",
};
/// The character-level Transformer.
pub const TRANSFORMER: Kind = Kind {
    tag: "textnet-transformer",
    legacy_tag: None,
    what: "a character-level Transformer",
    used_by: "textnet generate or eval",
};
/// The MNIST multilayer perceptron.
pub const MNIST_MLP: Kind =
    Kind { tag: "textnet-mnist", legacy_tag: None, what: "an MNIST MLP classifier", used_by: "textnet classify" };
/// The MNIST convolutional network.
pub const MNIST_CNN: Kind = Kind {
    tag: "textnet-mnist-cnn",
    legacy_tag: None,
    what: "an MNIST CNN classifier",
    used_by: "textnet mnist --model cnn",
};
/// The XOR network.
pub const XOR: Kind =
    Kind { tag: "textnet-xor", legacy_tag: Some("xor"), what: "an XOR network", used_by: "textnet xor" };
/// The sales table regressor.
pub const SALES: Kind = Kind {
    tag: "textnet-sales",
    legacy_tag: Some("sales"),
    what: "a sales (table) regressor",
    used_by: "textnet sales --model",
};

/// A network written as a spec (`textnet fit --layers`).
pub const FIT: Kind = Kind {
    tag: "textnet-fit",
    legacy_tag: None,
    what: "a network of textnet fit",
    used_by: "textnet fit --model, or textnet classify for images",
};

/// Every kind textnet writes.
pub const ALL: [&Kind; 7] = [&TEXT, &TRANSFORMER, &MNIST_MLP, &MNIST_CNN, &XOR, &SALES, &FIT];

impl Kind {
    /// The metadata entry that names this kind, for a file being written.
    pub fn entry(&self) -> (String, String) {
        (KEY.to_string(), self.tag.to_string())
    }

    /// Whether a file with this metadata is of this kind.
    pub fn matches(&self, metadata: &HashMap<String, String>) -> bool {
        of(metadata).is_some_and(|k| k == self)
    }

    /// Ok for a file of this kind; otherwise an error that says what the file is instead (or that its
    /// metadata names no kind textnet knows). `noun` is how this kind is named in the error, e.g.
    /// "textnet XOR model file".
    pub fn check(&self, metadata: Option<&HashMap<String, String>>, noun: &str) -> Result<()> {
        let meta = metadata.cloned().unwrap_or_default();
        if self.matches(&meta) {
            return Ok(());
        }
        match (describe(Some(&meta)), tag(&meta)) {
            (Some(what), _) => bail!("not a {noun}: {what}"),
            (None, Some(other)) => {
                bail!("not a textnet model file: its metadata names the format {other:?} (expected a {noun})")
            }
            (None, None) => bail!("not a textnet model file: its metadata names no format (expected a {noun})"),
        }
    }
}

/// The tag a file's metadata names its kind by (`format`, or the legacy `kind`).
pub fn tag(metadata: &HashMap<String, String>) -> Option<&str> {
    metadata.get(KEY).or_else(|| metadata.get(LEGACY_KEY)).map(String::as_str)
}

/// The kind a file's metadata names, if textnet knows it.
pub fn of(metadata: &HashMap<String, String>) -> Option<&'static Kind> {
    if let Some(tag) = metadata.get(KEY) {
        return ALL.into_iter().find(|k| k.tag == tag);
    }
    let legacy = metadata.get(LEGACY_KEY)?;
    ALL.into_iter().find(|k| k.legacy_tag == Some(legacy.as_str()))
}

/// The kind of a safetensors file from its bytes, if it is a whole safetensors file and its metadata
/// names a kind textnet knows.
pub fn of_bytes(bytes: &[u8]) -> Option<&'static Kind> {
    safetensors::SafeTensors::read_metadata(bytes).ok()?;
    claimed_by(bytes)
}

/// The kind a file's header names in its metadata, if textnet knows it, without checking its tensors'
/// entries: how a command picks the loader of a model file, so that a file of a known kind whose tensors
/// are broken gets the loader's reason.
pub fn claimed_by(bytes: &[u8]) -> Option<&'static Kind> {
    #[derive(serde::Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__")]
        metadata: Option<HashMap<String, String>>,
    }
    let length = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = bytes.get(8..length.checked_add(8)?)?;
    of(&serde_json::from_slice::<Header>(header).ok()?.metadata?)
}

/// "it is an XOR network (for textnet xor)" for a file of a kind textnet knows, or None when its
/// metadata names no kind textnet knows.
pub fn describe(metadata: Option<&HashMap<String, String>>) -> Option<String> {
    let kind = of(metadata?)?;
    Some(format!("it is {} (for {})", kind.what, kind.used_by))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str, value: &str) -> HashMap<String, String> {
        HashMap::from([(key.to_string(), value.to_string())])
    }

    #[test]
    fn legacy_tags_still_name_their_kind() {
        assert_eq!(of(&meta("kind", "xor")), Some(&XOR));
        assert_eq!(of(&meta("kind", "sales")), Some(&SALES));
        assert_eq!(of(&meta("format", "textnet-xor")), Some(&XOR));
        // a current tag under the legacy key, or a legacy tag under the current one, is no kind
        assert_eq!(of(&meta("kind", "textnet-xor")), None);
        assert_eq!(of(&meta("format", "xor")), None);
    }

    #[test]
    fn tags_are_distinct() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.tag, b.tag);
                assert!(a.legacy_tag.is_none() || a.legacy_tag != b.legacy_tag);
            }
        }
    }

    #[test]
    fn a_file_whose_tensors_are_broken_still_claims_its_kind() {
        let file = |shape: u64| {
            let header = serde_json::json!({
                "__metadata__": {"format": "textnet-transformer"},
                "w": {"dtype": "F32", "shape": [shape], "data_offsets": [0, 4]},
            })
            .to_string();
            [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), &[0; 4]].concat()
        };
        assert_eq!((of_bytes(&file(1)), claimed_by(&file(1))), (Some(&TRANSFORMER), Some(&TRANSFORMER)));
        assert_eq!((of_bytes(&file(1_000_000_000)), claimed_by(&file(1_000_000_000))), (None, Some(&TRANSFORMER)));
        assert_eq!(claimed_by(b"To be, or not to be"), None);
    }

    #[test]
    fn a_wrong_kind_is_named() {
        let err = XOR.check(Some(&meta("format", "textnet-mnist")), "textnet XOR model file").unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a textnet XOR model file: it is an MNIST MLP classifier (for textnet classify)"
        );
        assert!(XOR.check(Some(&meta("kind", "xor")), "x").is_ok());
        let err = XOR.check(Some(&meta("format", "gguf")), "x").unwrap_err().to_string();
        assert_eq!(err, "not a textnet model file: its metadata names the format \"gguf\" (expected a x)");
        let err = XOR.check(None, "x").unwrap_err().to_string();
        assert_eq!(err, "not a textnet model file: its metadata names no format (expected a x)");
    }
}
