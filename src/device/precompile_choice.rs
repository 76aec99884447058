//! Whether build.rs compiles the modules of `fused/precompiled.txt` ahead of time. That machine code only
//! serves a GPU and costs minutes of build on a small machine, so it is asked for: `TEXTNET_PRECOMPILE=1`
//! or the `precompile` cargo feature (the wheel's build). build.rs includes this file; the library
//! compiles it only for its tests.

/// What build.rs does about the modules of `fused/precompiled.txt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecompileChoice {
    /// Compile them (NVRTC must be found).
    Compile,
    /// Leave them to be compiled on first use, and why.
    Skip(&'static str),
}

/// The choice from `TEXTNET_PRECOMPILE` (`None` when unset) and whether the `precompile` feature is on:
/// 1 compiles, 0 does not even with the feature, unset or empty leaves it to the feature; anything else is
/// an error.
pub fn precompile_choice(variable: Option<&str>, feature: bool) -> Result<PrecompileChoice, String> {
    match variable.map(str::trim) {
        Some("1") => Ok(PrecompileChoice::Compile),
        Some("0") => Ok(PrecompileChoice::Skip("TEXTNET_PRECOMPILE=0 at build time")),
        None | Some("") if feature => Ok(PrecompileChoice::Compile),
        None | Some("") => Ok(PrecompileChoice::Skip("not asked for at build time (TEXTNET_PRECOMPILE=1)")),
        Some(other) => Err(format!(
            "TEXTNET_PRECOMPILE={other:?}: use 1 to compile the GPU kernels at build time, or 0 (the default) not to"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_decides_and_the_feature_fills_in_when_it_is_unset() {
        use PrecompileChoice::Compile;
        for feature in [false, true] {
            assert_eq!(precompile_choice(Some("1"), feature), Ok(Compile));
            assert_eq!(precompile_choice(Some(" 1\n"), feature), Ok(Compile));
            assert!(
                matches!(precompile_choice(Some("0"), feature), Ok(PrecompileChoice::Skip(why)) if why.contains("=0"))
            );
            assert_eq!(precompile_choice(None, feature) == Ok(Compile), feature);
            assert_eq!(precompile_choice(Some(""), feature) == Ok(Compile), feature);
        }
    }

    #[test]
    fn any_other_value_is_a_one_line_error() {
        for value in ["yes", "2", "true", "01"] {
            let err = precompile_choice(Some(value), true).unwrap_err();
            assert!(err.starts_with(&format!("TEXTNET_PRECOMPILE=\"{value}\": use 1")), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
