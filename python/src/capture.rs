//! `textnet.compile`'s native half: a training step captured once as a CUDA graph and replayed
//! (`nn::CapturedStep`), its body a Python function. The step's inputs are GPU tensors; each call hands
//! its own (`run_refilled`: a replay reads them where they are, or they are copied into the inputs) or
//! has refilled the inputs in place (`copy_`). The function runs eagerly on the first calls, is recorded on
//! the next, and is not called again while its inputs keep their shapes: each call replays the graph.

use crate::errors::nn_error;
use crate::tensor::{Data, PyTensor, gpu};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use textnet::nn::{self, CapturedStep, Tensor};

/// A captured step over fixed input tensors.
#[pyclass(name = "CapturedStep", module = "textnet._native", unsendable)]
pub(crate) struct PyCapturedStep {
    step: CapturedStep,
    /// The inputs, as the step holds them (for `run_refilled`).
    inputs: Vec<Data>,
}

#[pymethods]
impl PyCapturedStep {
    /// A step over `inputs`: float32 or int64 tensors on the GPU, refilled in place between calls.
    #[new]
    fn new(inputs: Vec<PyRef<'_, PyTensor>>) -> PyResult<Self> {
        let tensors: Vec<&Tensor> = (inputs.iter())
            .map(|input| match &input.data {
                Data::F32(t) | Data::DeviceIds(t) if t.is_on_device() => Ok(t),
                other => Err(PyValueError::new_err(format!(
                    "compile: a captured step's inputs are float32 or int64 tensors on the GPU, got {} {:?} on \
                     the {}",
                    other.dtype_name(),
                    other.shape(),
                    if other.on_gpu() { "GPU" } else { "host" }
                ))),
            })
            .collect::<PyResult<_>>()?;
        let step = CapturedStep::new(&gpu()?, &tensors).map_err(nn_error)?;
        Ok(PyCapturedStep { step, inputs: inputs.iter().map(|input| input.data.clone()).collect() })
    }

    /// `run` over the tensors `sources` (on the GPU, of the inputs' dtypes and shapes) in place of the
    /// inputs: a replay reads them where they are (`CapturedStep::run_with`), the other calls copy them
    /// into the inputs first, on the GPU.
    fn run_refilled(&mut self, sources: Vec<PyRef<'_, PyTensor>>, function: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        if sources.len() != self.inputs.len() {
            let (given, inputs) = (sources.len(), self.inputs.len());
            return Err(PyValueError::new_err(format!("compile: {given} tensors to refill {inputs} inputs")));
        }
        let mut tensors = Vec::with_capacity(sources.len());
        for (mine, theirs) in self.inputs.iter().zip(&sources) {
            match (mine, &theirs.data) {
                (Data::F32(to), Data::F32(from)) | (Data::DeviceIds(to), Data::DeviceIds(from))
                    if from.is_on_device() && to.shape() == from.shape() =>
                {
                    tensors.push(from)
                }
                (mine, theirs) => {
                    return Err(PyValueError::new_err(format!(
                        "compile: an input is a {} tensor {:?} on the GPU, but its refill is a {} tensor {:?} on the {}",
                        mine.dtype_name(),
                        mine.shape(),
                        theirs.dtype_name(),
                        theirs.shape(),
                        if theirs.on_gpu() { "GPU" } else { "host" }
                    )));
                }
            }
        }
        self.call(function, |step, body| step.run_with(&tensors, body))
    }

    /// One step: `function` (no arguments; it returns a float32 tensor on the GPU, the loss) run eagerly,
    /// recorded, or replayed without being called. A replay returns the same tensor each time, holding
    /// this step's values. An exception `function` raises is raised here.
    fn run(&mut self, function: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.call(function, |step, body| step.run(body))
    }

    /// The fusions the last capture made, each with how many times.
    fn fusions(&self) -> Vec<(String, usize)> {
        self.step.fusions().to_vec()
    }

    /// How many times the step was captured.
    fn captures(&self) -> usize {
        self.step.captures()
    }

    /// Whether the next call replays a graph.
    fn is_captured(&self) -> bool {
        self.step.is_captured()
    }
}

impl PyCapturedStep {
    /// `run`'s body: `run` (the engine's `run` or `run_with`) given the step and `function` as the
    /// engine's step closure.
    fn call(
        &mut self,
        function: &Bound<'_, PyAny>,
        run: impl FnOnce(&mut CapturedStep, &mut dyn FnMut() -> nn::Result<Tensor>) -> nn::Result<Tensor>,
    ) -> PyResult<PyTensor> {
        let mut raised: Option<PyErr> = None;
        let output = run(&mut self.step, &mut || {
            let returned = function.call0().and_then(|out| Ok(out.extract::<PyRef<'_, PyTensor>>()?.data.clone()));
            let problem = match returned {
                Ok(Data::F32(t)) => return Ok(t),
                Ok(other) => {
                    let problem =
                        format!("the step returned a {} tensor; it must return a float32 one", other.dtype_name());
                    raised = Some(PyValueError::new_err(format!("compile: {problem}")));
                    problem
                }
                Err(e) => {
                    let problem = e.to_string();
                    raised = Some(e);
                    problem
                }
            };
            Err(nn::Error::Value { op: "compile", problem })
        });
        match (output, raised) {
            (Ok(t), _) => Ok(PyTensor::of(Data::F32(t))),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(nn_error(e)),
        }
    }
}
