//! The list of pipelines, in the order `selftest` runs them and `textnet --help` shows their commands. A
//! new pipeline is its folder under `src/`, its file in `fused/` and one line here.

use crate::pipeline::Pipeline;

/// Every pipeline, in the order `--help`, the selftest and `textnet bench` list them.
pub const ALL: &[&Pipeline] = &[
    &crate::text::PIPELINE,
    &crate::mnist::PIPELINE,
    &crate::xor::PIPELINE,
    &crate::sales::PIPELINE,
    &crate::matmul::PIPELINE,
    &crate::transformer::PIPELINE,
    &crate::fit::PIPELINE,
];

/// The pipeline named `name`.
pub fn named(name: &str) -> Option<&'static Pipeline> {
    ALL.iter().copied().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_commands_and_benches_are_distinct() {
        let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
        let mut commands: Vec<&str> = ALL.iter().flat_map(|p| p.commands.iter().map(|c| c.name)).collect();
        let mut benches: Vec<&str> = ALL.iter().flat_map(|p| p.benches.iter().map(|b| b.name)).collect();
        for list in [&mut names, &mut commands, &mut benches] {
            let len = list.len();
            list.sort();
            list.dedup();
            assert_eq!(list.len(), len, "{list:?}");
        }
        for top in ["generate", "eval", "classify", "export", "selftest", "bench", "help"] {
            assert!(!commands.contains(&top), "{top} is a command of textnet itself");
        }
    }

    #[test]
    fn every_model_kind_belongs_to_one_pipeline() {
        for kind in crate::io::modelkind::ALL {
            let owners = ALL.iter().filter(|p| p.models.contains(&kind)).count();
            assert_eq!(owners, 1, "{} is written by {owners} pipelines", kind.tag);
        }
        let listed: usize = ALL.iter().map(|p| p.models.len()).sum();
        assert_eq!(listed, crate::io::modelkind::ALL.len());
    }

    #[test]
    fn every_pipeline_has_a_folder() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for p in ALL {
            assert!(src.join(p.name).join("mod.rs").is_file(), "src/{}/mod.rs", p.name);
        }
    }
}
