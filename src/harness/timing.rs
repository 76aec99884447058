//! Device timing for every pipeline's bench: CUDA events around work on the GPU's stream, graph replays
//! per launch, and the median the benches report.

use crate::device::Gpu;
use anyhow::{Context, Result};
use cudarc::driver::CudaGraph;
use cudarc::driver::sys::CUevent_flags;

/// Median of a list of timings.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Device time of `work`, in milliseconds, between two events on the GPU's stream.
pub fn time_on_device(gpu: &Gpu, work: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(&gpu.stream)?;
    work()?;
    end.record(&gpu.stream)?;
    Ok(start.elapsed_ms(&end).context("a benchmarked kernel failed")? as f64)
}

/// Microseconds per launch of `graph` (which holds `launches` launches of one kernel): one warm-up
/// replay, then `repeats` timed replays.
pub fn time_graph_launches(gpu: &Gpu, graph: &CudaGraph, launches: usize, repeats: usize) -> Result<Vec<f64>> {
    graph.launch()?;
    gpu.stream.synchronize().context("a benchmarked kernel failed")?;
    (0..repeats).map(|_| time_on_device(gpu, || Ok(graph.launch()?)).map(|ms| ms * 1e3 / launches as f64)).collect()
}
