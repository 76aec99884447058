//! Typed kernel arguments: the struct a kernel family takes by value, declared once in its kernel file and
//! mirrored here by a `#[repr(C)]` Rust struct of the same name (`kernel_struct!`), whose bytes
//! `StructArg::of` writes field by field at the Rust struct's own offsets and `Gpu::launch_struct` passes
//! as the kernel's one parameter (`launch_with_struct`: its first, before positional ones). A test per
//! struct reads each field's offset, size and C type back from the compiled kernel file
//! (`layout_in_kernel`), so a field moved, retyped or missing on either side fails a test instead of a
//! training run.
//!
//! A struct's pointer fields carry no `__restrict__`: NVRTC gives the non-coherent read-only loads
//! (`ld.global.nc`) only to restrict-qualified pointers that are kernel parameters themselves, not to
//! pointers read from a struct, not even through an inlined function of restrict parameters in a kernel
//! with atomics. So a kernel whose speed rests on those loads either keeps its buffers as parameters and
//! takes only its settings as a struct (`cnn_update`), or reads them through `__ldg`, as the text kernels
//! do (fused/text_buffers.cuh says where that falls short); compare the PTX before moving one.

use super::Gpu;
use super::launch::{Arg, StructArg};
use crate::ops::optim::OptimConfig;
use cudarc::driver::{CudaSlice, DevicePtr};
use std::marker::PhantomData;

/// A field's C type as the layout test compares it: a scalar or pointer by its code (`C_TYPE_PROBE`'s
/// `textnet_kind`), or a struct declared in the kernel file by its name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldType {
    /// int 1, unsigned 2, float 3, double 4, unsigned char 5, unsigned long long 6; a pointer 16 + its
    /// pointee's code (0 for a type of neither kind, such as a struct).
    Code(i64),
    /// A struct of the kernel file, by name.
    Struct(&'static str),
}

/// A type a kernel struct's field may have: its C type and its little-endian bytes.
pub trait KernelField: Copy {
    /// The C type it mirrors.
    const TYPE: FieldType;
    /// Writes its `size_of::<Self>()` bytes into `out`.
    fn write(&self, out: &mut [u8]);
}

/// A type a device pointer may point to, with its C type's code.
pub trait Pointee {
    /// See `FieldType::Code`.
    const CODE: i64;
}

/// What a pointer points to when the Rust side has no mirror of it (a struct of the kernel file, bf16).
pub struct Opaque;

macro_rules! scalars {
    ($($t:ty => $code:expr),*) => {$(
        impl Pointee for $t {
            const CODE: i64 = $code;
        }
        impl KernelField for $t {
            const TYPE: FieldType = FieldType::Code($code);
            fn write(&self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
scalars!(i32 => 1, u32 => 2, f32 => 3, f64 => 4, u8 => 5, u64 => 6);

impl Pointee for Opaque {
    const CODE: i64 = 0;
}

/// A device address of `T`s: a `T*` field (const or not; the kernel file says which).
#[repr(transparent)]
pub struct Address<T>(u64, PhantomData<fn() -> T>);

impl<T> Clone for Address<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Address<T> {}

impl<T> std::fmt::Debug for Address<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl<T> Address<T> {
    /// The null pointer.
    pub const NULL: Address<T> = Address(0, PhantomData);

    /// The address of `slice`'s first element.
    pub fn of(gpu: &Gpu, slice: &CudaSlice<T>) -> Address<T> {
        Self::reinterpret(gpu, slice)
    }

    /// The address of `slice`'s first element, read as `T`s (the nn engine keeps its step counters in
    /// f32 buffers).
    pub fn reinterpret<U>(gpu: &Gpu, slice: &CudaSlice<U>) -> Address<T> {
        let (ptr, _no_sync_needed) = slice.device_ptr(&gpu.stream);
        Address(ptr, PhantomData)
    }

    /// The address of element `index` of the array starting here.
    pub fn element(self, index: usize) -> Address<T> {
        Address(self.0 + (index * size_of::<T>()) as u64, PhantomData)
    }
}

impl<T> From<Address<T>> for Arg {
    fn from(address: Address<T>) -> Arg {
        Arg::Ptr(address.0)
    }
}

impl<T: Pointee> KernelField for Address<T> {
    const TYPE: FieldType = FieldType::Code(16 + T::CODE);
    fn write(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.0.to_le_bytes());
    }
}

/// A field of a kernel struct as one side declares it: name, byte offset, byte size and C type.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldLayout {
    /// The field's name, the same on both sides.
    pub name: &'static str,
    /// Its byte offset in the struct.
    pub offset: usize,
    /// Its size in bytes.
    pub size: usize,
    /// Its C type.
    pub ctype: FieldType,
}

/// A `#[repr(C)]` mirror of a struct a kernel file declares (made by `kernel_struct!`).
pub trait KernelStruct: Copy {
    /// The struct's name, the same in the kernel file.
    const NAME: &'static str;
    /// Each field, in declaration order, where the Rust struct has it.
    fn fields() -> Vec<FieldLayout>;
    /// Writes each field's bytes at its offset into `out` (`size_of::<Self>()` bytes, padding left as is).
    fn write_fields(&self, out: &mut [u8]);
}

/// Declares a `#[repr(C)]` struct mirroring the kernel file's struct of the same name, each field of a
/// `KernelField` type, and makes it a `KernelStruct` (and a field of other kernel structs).
macro_rules! kernel_struct {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($(#[$field_meta:meta])* $field_vis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name {
            $($(#[$field_meta])* $field_vis $field: $ty),*
        }

        impl $crate::device::kernel_struct::KernelStruct for $name {
            const NAME: &'static str = stringify!($name);
            fn fields() -> Vec<$crate::device::kernel_struct::FieldLayout> {
                vec![$($crate::device::kernel_struct::FieldLayout {
                    name: stringify!($field),
                    offset: std::mem::offset_of!($name, $field),
                    size: size_of::<$ty>(),
                    ctype: <$ty as $crate::device::kernel_struct::KernelField>::TYPE,
                }),*]
            }
            fn write_fields(&self, out: &mut [u8]) {
                $(
                    let at = std::mem::offset_of!($name, $field);
                    $crate::device::kernel_struct::KernelField::write(&self.$field, &mut out[at..at + size_of::<$ty>()]);
                )*
            }
        }

        impl $crate::device::kernel_struct::KernelField for $name {
            const TYPE: $crate::device::kernel_struct::FieldType =
                $crate::device::kernel_struct::FieldType::Struct(stringify!($name));
            fn write(&self, out: &mut [u8]) {
                $crate::device::kernel_struct::KernelStruct::write_fields(self, out);
            }
        }
    };
}
pub(crate) use kernel_struct;

impl StructArg {
    /// The bytes of `args`, in the layout its kernel file declares (padding zero).
    pub fn of<S: KernelStruct>(args: &S) -> StructArg {
        let mut bytes = vec![0u8; size_of::<S>()];
        args.write_fields(&mut bytes);
        StructArg::new(&bytes)
    }
}

kernel_struct! {
    /// The optimizer's settings as a kernel takes them (`OptimSettings` in fused/optim.cuh); not the rate,
    /// which a schedule changes every step.
    pub struct OptimSettings {
        kind: i32,
        momentum: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        clip_norm: f32,
    }
}

impl OptimConfig {
    /// The settings an update kernel takes (cnn_update, text_batch_optimize, fit_update, dense_train_epoch).
    pub fn kernel_settings(&self) -> OptimSettings {
        OptimSettings {
            kind: self.kind.kernel_code(),
            momentum: self.momentum,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            clip_norm: self.clip_norm,
        }
    }
}

kernel_struct! {
    /// One dropout site as a kernel takes it, its first parameter (`DropoutArgs` in fused/dropout.cuh): the
    /// device's step counter, the site's per-run seed, the threshold (0: off) and the survivors' scale.
    pub struct DropoutArgs {
        /// The device's step counter (read only when on).
        pub step: Address<u32>,
        /// The site's per-run seed.
        pub seed: u32,
        /// p·2³²: an element survives when its hash is at least this; 0 turns dropout off.
        pub threshold: u32,
        /// 1/(1 − p), the survivors' factor.
        pub scale: f32,
    }
}

impl DropoutArgs {
    /// Site `seed`'s dropout with probability `p` (0: off), its key drawn from the step counter `step`.
    pub fn site(step: Address<u32>, seed: u32, p: f32) -> DropoutArgs {
        use crate::ops::dropout::{dropout_scale, dropout_threshold};
        if p > 0.0 {
            DropoutArgs { step, seed, threshold: dropout_threshold(p), scale: dropout_scale(p) }
        } else {
            Self::off()
        }
    }

    /// No dropout: every factor 1, the step counter not read.
    pub fn off() -> DropoutArgs {
        DropoutArgs { step: Address::NULL, seed: 0, threshold: 0, scale: 1.0 }
    }
}

/// The C side of `FieldType::Code`: a field's type as a constant the PTX shows.
const C_TYPE_PROBE: &str = "
template <class T> struct textnet_kind { static constexpr int v = 0; };
template <> struct textnet_kind<int> { static constexpr int v = 1; };
template <> struct textnet_kind<unsigned> { static constexpr int v = 2; };
template <> struct textnet_kind<float> { static constexpr int v = 3; };
template <> struct textnet_kind<double> { static constexpr int v = 4; };
template <> struct textnet_kind<unsigned char> { static constexpr int v = 5; };
template <> struct textnet_kind<unsigned long long> { static constexpr int v = 6; };
template <class T> struct textnet_kind<const T> { static constexpr int v = textnet_kind<T>::v; };
template <class T> struct textnet_kind<T*> { static constexpr int v = 16 + textnet_kind<T>::v; };
template <class T> struct textnet_kind<T* __restrict__> { static constexpr int v = 16 + textnet_kind<T>::v; };
template <class A, class B> struct textnet_same { static constexpr int v = 0; };
template <class A> struct textnet_same<A, A> { static constexpr int v = 1; };
";

/// The layout of `S` as kernel file `unit` (compiled with `defines`) declares it, and as the Rust mirror
/// does: each field's (name, offset, size, type), then the whole struct's (name, alignment, size). Needs
/// NVRTC, not a GPU. NVRTC has no `offsetof`; EDG's `__INTADDR__` folds the classic `&((S*)0)->f` into a
/// constant.
pub fn layout_in_kernel<S: KernelStruct>(
    unit: &str,
    defines: &[(&str, i64)],
) -> anyhow::Result<(Vec<FieldLayout>, Vec<FieldLayout>)> {
    let (name, fields) = (S::NAME, S::fields());
    let mut expressions = Vec::new();
    for f in &fields {
        expressions.push(format!("__INTADDR__(&(({name}*)0)->{})", f.name));
        expressions.push(format!("sizeof((({name}*)0)->{})", f.name));
        expressions.push(match f.ctype {
            FieldType::Code(_) => format!("textnet_kind<decltype({name}::{})>::v", f.name),
            FieldType::Struct(of) => format!("textnet_same<decltype({name}::{}), {of}>::v", f.name),
        });
    }
    expressions.push(format!("alignof({name})"));
    expressions.push(format!("sizeof({name})"));
    let asked: Vec<&str> = expressions.iter().map(String::as_str).collect();
    let values = super::compile::kernel_constants_after(unit, defines, C_TYPE_PROBE, &asked)?;
    let kernel = fields.iter().zip(values.chunks(3)).map(|(f, v)| FieldLayout {
        name: f.name,
        offset: v[0] as usize,
        size: v[1] as usize,
        ctype: match f.ctype {
            FieldType::Code(_) => FieldType::Code(v[2]),
            // The name of the struct the kernel file's field is not.
            FieldType::Struct(of) => FieldType::Struct(if v[2] == 1 { of } else { "another type" }),
        },
    });
    let whole = |align: usize, size: usize| FieldLayout { name, offset: align, size, ctype: FieldType::Struct(name) };
    let tail = &values[values.len() - 2..];
    let kernel = kernel.chain([whole(tail[0] as usize, tail[1] as usize)]).collect();
    let mirror = fields.into_iter().chain([whole(align_of::<S>(), size_of::<S>())]).collect();
    Ok((kernel, mirror))
}

/// Panics at the first field where kernel file `unit`'s `S` (compiled with `defines`) and its Rust mirror
/// differ in offset, size or type, or where the structs differ in alignment or size.
#[cfg(test)]
pub(crate) fn assert_kernel_layout<S: KernelStruct>(unit: &str, defines: &[(&str, i64)]) {
    let (kernel, mirror) = layout_in_kernel::<S>(unit, defines).unwrap();
    for (k, m) in kernel.iter().zip(&mirror) {
        assert_eq!(k, m, "{}.{}: as fused/{unit}.cu declares it (left), as mirrored in Rust (right)", S::NAME, m.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    kernel_struct! {
        /// Two fields of each size, and a nested struct, for the byte layout.
        struct Probe {
            pointer: Address<f32>,
            count: i32,
            inner: Inner,
            rate: f32,
            bytes: Address<u8>,
        }
    }

    kernel_struct! {
        struct Inner {
            kind: u32,
            scale: f32,
        }
    }

    #[test]
    fn the_dropout_args_are_dropout_cuhs() {
        // Every kernel file that includes dropout.cuh declares them alike; nn.cu is one.
        assert_kernel_layout::<DropoutArgs>("nn", &[]);
    }

    #[test]
    fn the_optimizer_settings_are_optim_cuhs() {
        // Every kernel file that includes optim.cuh declares them alike; mnist_cnn.cu is one.
        assert_kernel_layout::<OptimSettings>("mnist_cnn", &[]);
    }

    #[test]
    fn fields_land_at_the_rust_structs_offsets() {
        let probe = Probe {
            pointer: Address(0x0102_0304_0506_0708, PhantomData),
            count: -2,
            inner: Inner { kind: 7, scale: 1.5 },
            rate: 0.25,
            bytes: Address::NULL.element(3),
        };
        let arg = StructArg::of(&probe);
        assert_eq!(arg.len(), 32);
        let names: Vec<_> = Probe::fields().iter().map(|f| (f.name, f.offset, f.size)).collect();
        assert_eq!(names, [("pointer", 0, 8), ("count", 8, 4), ("inner", 12, 8), ("rate", 20, 4), ("bytes", 24, 8)]);
        let mut expected = Vec::new();
        expected.extend(0x0102_0304_0506_0708u64.to_le_bytes());
        expected.extend((-2i32).to_le_bytes());
        expected.extend(7u32.to_le_bytes());
        expected.extend(1.5f32.to_le_bytes());
        expected.extend(0.25f32.to_le_bytes());
        expected.extend(3u64.to_le_bytes());
        assert_eq!(arg.bytes(), expected);
        assert_eq!(Probe::fields()[2].ctype, FieldType::Struct("Inner"));
        assert_eq!(Probe::fields()[4].ctype, FieldType::Code(21));
    }
}
