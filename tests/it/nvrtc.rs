//! Every `fused/*.cu` file compiles through NVRTC, for Hopper and Ampere, with default sizes and with
//! awkward ones. Needs libnvrtc (CI installs the `nvidia-cuda-nvrtc-cu12` wheel), not a GPU; it fails,
//! never skips, when NVRTC is missing.

use textnet::device::{compile::KERNEL_SOURCES, compile::compile_ptx, compile::kernel_source};

#[test]
fn every_fused_kernel_compiles_with_nvrtc() {
    assert!(!KERNEL_SOURCES.is_empty(), "build.rs embedded no kernels");
    for unit in KERNEL_SOURCES {
        for cc in [(9, 0), (8, 0)] {
            let ptx = compile_ptx(unit, cc, &[])
                .unwrap_or_else(|e| panic!("fused/{}.cu for sm_{}{}: {e:#}", unit.name, cc.0, cc.1));
            assert!(ptx.contains(".entry"), "fused/{}.cu produced PTX without kernels", unit.name);
        }
    }
}

#[test]
fn text_kernels_compile_for_odd_shapes() {
    let batch_unit = textnet::device::compile::kernel_source("text_batch").unwrap();
    for (d, h) in [(1, 1), (33, 100), (64, 256), (256, 2048)] {
        let defines = [format!("-DTEXT_D={d}"), format!("-DTEXT_H={h}")];
        let ptx = compile_ptx(batch_unit, (9, 0), &defines).unwrap_or_else(|e| panic!("text_batch D={d} H={h}: {e:#}"));
        for kernel in ["text_batch_forward", "text_batch_backward", "text_batch_update"] {
            assert!(ptx.contains(kernel), "{kernel} missing from the PTX for D={d} H={h}");
        }
    }
    let sample_unit = textnet::device::compile::kernel_source("text_sample").unwrap();
    for (d, h) in [(1, 4), (33, 100), (64, 256), (1024, 2048)] {
        let defines = [format!("-DTEXT_D={d}"), format!("-DTEXT_H={h}")];
        let ptx =
            compile_ptx(sample_unit, (9, 0), &defines).unwrap_or_else(|e| panic!("text_sample D={d} H={h}: {e:#}"));
        for kernel in ["sample_forward", "sample_backward", "sample_update", "sample_flush"] {
            assert!(ptx.contains(kernel), "{kernel} missing from the PTX for D={d} H={h}");
        }
    }
    let unit = textnet::device::compile::kernel_source("text").unwrap();
    for (d, h, sb) in [(1, 1, 8), (33, 100, 8), (64, 256, 8), (1024, 2048, 1)] {
        let defines = [format!("-DTEXT_D={d}"), format!("-DTEXT_H={h}"), format!("-DTEXT_SB={sb}")];
        let ptx = compile_ptx(unit, (9, 0), &defines).unwrap_or_else(|e| panic!("D={d} H={h}: {e:#}"));
        for kernel in
            ["text_forward", "text_backward", "text_update", "text_advance", "text_eval_rank", "text_eval_finish"]
        {
            assert!(ptx.contains(kernel), "{kernel} missing from the PTX for D={d} H={h}");
        }
    }
}

#[test]
fn kernels_compile_to_machine_code_for_the_gpu_at_hand() {
    // What `Gpu::module` loads: a CUBIN (an ELF image) for the exact architecture, so the driver has
    // nothing left to compile.
    let unit = textnet::device::compile::kernel_source("text_sample").unwrap();
    let defines = ["-DTEXT_D=64".to_string(), "-DTEXT_H=256".to_string()];
    for cc in [(9, 0), (8, 0)] {
        let cubin = textnet::device::compile::compile_cubin(unit, cc, &defines)
            .unwrap_or_else(|e| panic!("sm_{}{}: {e:#}", cc.0, cc.1));
        assert_eq!(&cubin[..4], b"\x7fELF", "sm_{}{}: not an ELF image", cc.0, cc.1);
    }
    let broken = textnet::device::compile::KernelSource {
        name: "broken",
        hash: "",
        source: "__global__ void k() { undeclared; }",
    };
    let err = textnet::device::compile::compile_cubin(&broken, (9, 0), &[]).unwrap_err();
    assert!(format!("{err:#}").contains("undeclared"), "the error carries NVRTC's log: {err:#}");
}

#[test]
fn transformer_kernels_compile_for_other_shapes() {
    let unit = textnet::device::compile::kernel_source("transformer").unwrap();
    for (c, hs, t) in [(32, 8, 5), (64, 16, 64), (96, 32, 33), (384, 64, 256)] {
        let defines = [format!("-DTF_C={c}"), format!("-DTF_HS={hs}"), format!("-DTF_T={t}")];
        let ptx =
            compile_ptx(unit, (9, 0), &defines).unwrap_or_else(|e| panic!("transformer C={c} HS={hs} T={t}: {e:#}"));
        for kernel in [
            "tf_embed_layernorm",
            "tf_linear_forward",
            "tf_attention_forward",
            "tf_classifier",
            "tf_linear_backward",
            "tf_layernorm_backward",
            "tf_attention_backward",
            "tf_embedding_backward",
            "tf_adamw",
        ] {
            assert!(ptx.contains(kernel), "{kernel} missing from the PTX for C={c} HS={hs} T={t}");
        }
    }
}

#[test]
fn fit_kernels_compile_for_every_spec_the_quick_selftest_checks() {
    use std::collections::BTreeSet;
    let plan = textnet::harness::check::Plan { seed: 1, quick: true, groups: Vec::new() };
    let unit = kernel_source("fit").unwrap();
    let requests: BTreeSet<_> = textnet::fit::checks::modules(&plan).into_iter().collect();
    assert!(requests.len() > 10, "{requests:?}");
    for (name, defines) in requests {
        let options: Vec<String> = defines.iter().map(|(n, v)| format!("-D{n}={v}")).collect();
        let ptx = compile_ptx(unit, (9, 0), &options).unwrap_or_else(|e| panic!("{name} {options:?}: {e:#}"));
        assert!(ptx.contains(".entry"), "{options:?} produced no kernels");
    }
}

/// The folder of the libnvrtc this process loads through `LD_LIBRARY_PATH`, if it comes from there.
fn nvrtc_folder_on_library_path() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("LD_LIBRARY_PATH")?;
    std::env::split_paths(&path).find(|dir| {
        std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()).any(|e| {
            let name = e.file_name();
            name.to_str().is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
    })
}

#[test]
fn nvrtc_is_found_without_ld_library_path() {
    // This test binary again, running only the compile below, with LD_LIBRARY_PATH taken away and the
    // folder named by TEXTNET_NVRTC instead (as a user would not set LD_LIBRARY_PATH). Where the loader
    // finds NVRTC by itself (a CUDA toolkit), the child finds it that way.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.args(["--exact", "nvrtc::one_module_compiles", "--include-ignored", "--quiet"]).env_remove("LD_LIBRARY_PATH");
    if let Some(dir) = nvrtc_folder_on_library_path() {
        child.env("TEXTNET_NVRTC", dir);
    }
    let out = child.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by nvrtc_is_found_without_ld_library_path, in a process of its own"]
fn one_module_compiles() {
    let ptx = compile_ptx(kernel_source("xor").unwrap(), (9, 0), &[]).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(ptx.contains(".entry"));
}
