//! Kernel tables: the structs of fixed-length arrays that fused/nn.cu's many-tensors-a-launch kernels take
//! by value as their first parameter (`UpdateTable`, `ChunkTable`, `WeightGradTable`), written here byte
//! by byte in their C layout, and each entry's first block (a prefix sum over its blocks).

use super::DeviceBuffer;
use super::ops::int;
use crate::nn::error::Result;

/// One field of a C struct of fixed-length arrays: its name as fused/nn.cu declares it, an element's size
/// in bytes (its alignment too: addresses, ints and floats) and the element count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Field {
    pub(super) name: &'static str,
    pub(super) size: usize,
    pub(super) count: usize,
}

pub(super) const fn field(name: &'static str, size: usize, count: usize) -> Field {
    Field { name, size, count }
}

/// The byte offset of each field and the struct's size, by C's rules: each field at the next multiple of
/// its alignment, the size a multiple of the largest alignment.
pub(super) fn layout(fields: &[Field]) -> (Vec<usize>, usize) {
    let (mut offsets, mut end, mut align) = (Vec::with_capacity(fields.len()), 0usize, 1usize);
    for f in fields {
        let at = end.next_multiple_of(f.size);
        offsets.push(at);
        end = at + f.size * f.count;
        align = align.max(f.size);
    }
    (offsets, end.next_multiple_of(align))
}

/// The struct `fields` describe, with `values[i]` from the start of field i (each value's low `size`
/// bytes, little-endian: an address, or an int's or a float's bits) and zeros everywhere else.
pub(super) fn table_bytes(fields: &[Field], values: &[Vec<u64>]) -> Vec<u8> {
    let (offsets, size) = layout(fields);
    let mut bytes = vec![0u8; size];
    for ((f, at), values) in fields.iter().zip(offsets).zip(values) {
        debug_assert!(values.len() <= f.count, "{} values for the {} of field {}", values.len(), f.count, f.name);
        for (i, v) in values.iter().take(f.count).enumerate() {
            let start = at + i * f.size;
            bytes[start..start + f.size].copy_from_slice(&v.to_le_bytes()[..f.size]);
        }
    }
    bytes
}

/// A kernel int's bits as a table value.
pub(super) fn int_value(op: &'static str, n: usize) -> Result<u64> {
    Ok(u64::from(int(op, n)? as u32))
}

/// A float's bits as a table value.
pub(super) fn float_value(x: f32) -> u64 {
    u64::from(x.to_bits())
}

/// A buffer's address as a table value (0, a null pointer, for none).
pub(super) fn address(buffer: Option<&DeviceBuffer>) -> u64 {
    buffer.map_or(0, DeviceBuffer::address)
}

/// Each tensor's first block when tensors of `lens` elements take a block per chunk of `chunk`, then the
/// blocks of all (`lens.len() + 1` values): a table's `first_block`.
pub(super) fn first_blocks(op: &'static str, lens: impl IntoIterator<Item = usize>, chunk: usize) -> Result<Vec<u64>> {
    let mut first = vec![0u64];
    let mut blocks = 0usize;
    for len in lens {
        blocks += len.div_ceil(chunk);
        first.push(int_value(op, blocks)?);
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::launch::KERNEL_PARAMETER_BYTES;
    use crate::nn::cuda::optim::{CHUNK_TABLE, TENSOR_CHUNK, UPDATE_CHUNK, UPDATE_TABLE};
    use crate::nn::cuda::weight_grads::WEIGHT_GRAD_TABLE;

    const KERNEL_FILE: &str = include_str!("../../../fused/nn.cu");

    /// The value of `constexpr int NAME = value;` in fused/nn.cu.
    fn kernel_int(name: &str) -> usize {
        let declaration = format!("constexpr int {name} = ");
        let at = KERNEL_FILE.find(&declaration).unwrap_or_else(|| panic!("{name} not declared")) + declaration.len();
        KERNEL_FILE[at..].split(';').next().unwrap().trim().parse().unwrap()
    }

    /// The fields of `struct NAME { … };` in fused/nn.cu as (name, element size, count):
    /// `float* theta[UPDATE_TABLE_TENSORS];` is ("theta", 8, 64), `int count;` ("count", 4, 1).
    fn kernel_struct(name: &str) -> Vec<(String, usize, usize)> {
        let start = KERNEL_FILE.find(&format!("struct {name} {{")).unwrap_or_else(|| panic!("struct {name}"));
        let body = &KERNEL_FILE[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        let mut fields = Vec::new();
        for line in body.lines().map(|l| l.split("//").next().unwrap().trim()).filter(|l| !l.is_empty()) {
            let declaration = line.strip_suffix(';').unwrap_or_else(|| panic!("{line}"));
            let (head, dims) = match declaration.split_once('[') {
                Some((head, dims)) => (head, Some(dims.strip_suffix(']').unwrap())),
                None => (declaration, None),
            };
            let (kind, name) = head.rsplit_once([' ', '*']).unwrap();
            let size = if head.contains('*') { 8 } else { 4 };
            assert!(size == 8 || ["int", "float"].contains(&kind.trim()), "{line}");
            let count = match dims.map(|d| d.split_once(" + ")) {
                None => 1,
                Some(Some((constant, extra))) => kernel_int(constant) + extra.parse::<usize>().unwrap(),
                Some(None) => kernel_int(dims.unwrap()),
            };
            fields.push((name.to_string(), size, count));
        }
        fields
    }

    #[test]
    fn the_tables_are_the_kernel_files_structs() {
        assert_eq!(kernel_int("TENSOR_CHUNK"), TENSOR_CHUNK);
        assert_eq!(kernel_int("UPDATE_CHUNK"), UPDATE_CHUNK);
        let described =
            |fields: &[Field]| fields.iter().map(|f| (f.name.to_string(), f.size, f.count)).collect::<Vec<_>>();
        assert_eq!(kernel_struct("UpdateTable"), described(&UPDATE_TABLE));
        assert_eq!(kernel_struct("ChunkTable"), described(&CHUNK_TABLE));
        assert_eq!(kernel_struct("WeightGradTable"), described(&WEIGHT_GRAD_TABLE));
    }

    #[test]
    fn each_launch_passes_at_most_4_kb() {
        // A struct (8-byte aligned) first, then the kernel's other parameters, each at its alignment.
        let bytes = |table: &[Field], rest: &[Field]| {
            let whole = [&[field("table", 8, layout(table).1 / 8)], rest].concat();
            layout(&whole).1
        };
        let update = bytes(&UPDATE_TABLE, &[field("kind", 4, 1), field("base_lr", 8, 1), field("scalars", 4, 5)]);
        let sums = bytes(&CHUNK_TABLE, &[field("partials", 8, 1), field("first_slot", 4, 1)]);
        let scale = bytes(&CHUNK_TABLE, &[field("factor", 8, 1)]);
        let weight_grads = bytes(&WEIGHT_GRAD_TABLE, &[]);
        for (kernel, size) in [
            ("nn_update_tensors", update),
            ("nn_sum_squares_chunks", sums),
            ("nn_scale_chunks", scale),
            ("nn_linear_grad_weights", weight_grads),
        ] {
            assert!(size <= KERNEL_PARAMETER_BYTES, "{kernel} takes {size} bytes of parameters");
        }
    }

    #[test]
    fn fields_are_laid_out_as_c_lays_them_out() {
        // An int after pointers, a pointer after an odd count of ints (padded to 8), a size rounded to 8.
        let fields = [field("a", 8, 2), field("b", 4, 3), field("c", 8, 1), field("d", 4, 1)];
        assert_eq!(layout(&fields), (vec![0, 16, 32, 40], 48));
        assert_eq!(layout(&[field("n", 4, 3)]), (vec![0], 12));
        // The values land at their offsets, little-endian, the rest zero.
        let bytes = table_bytes(&fields, &[vec![0x0102_0304_0506_0708], vec![7, u64::from(u32::MAX)], vec![], vec![9]]);
        assert_eq!(bytes.len(), 48);
        assert_eq!(bytes[..8], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(bytes[8..16], [0; 8]);
        assert_eq!(bytes[16..28], [7, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0]);
        assert_eq!(bytes[28..40], [0; 12]);
        assert_eq!(bytes[40..44], [9, 0, 0, 0]);
    }

    #[test]
    fn each_tensor_starts_after_the_chunks_of_those_before() {
        let lens = [1, 0, TENSOR_CHUNK, TENSOR_CHUNK + 1, 3 * TENSOR_CHUNK - 1];
        let first = first_blocks("t", lens, TENSOR_CHUNK).unwrap();
        assert_eq!(first, [0, 1, 1, 2, 4, 7]);
        assert_eq!(first_blocks("t", [], UPDATE_CHUNK).unwrap(), [0]);
        let err = first_blocks("t", [usize::MAX / 2], TENSOR_CHUNK).unwrap_err().to_string();
        assert!(err.contains("more than a kernel's int indexes"), "{err}");
    }
}

/// Needs NVRTC (not a GPU): the kernel file's own sizes of the tables, against `layout`. NVRTC has no
/// `offsetof`, so the fields' offsets are checked on the GPU instead: the selftest's multi-tensor
/// optimizer and clip checks and the grouped weight gradients' read every field through them.
#[cfg(test)]
mod kernel_layout {
    use super::*;
    use crate::device::compile::kernel_constants;
    use crate::nn::cuda::optim::{CHUNK_TABLE, UPDATE_TABLE};
    use crate::nn::cuda::weight_grads::WEIGHT_GRAD_TABLE;

    #[test]
    fn sizes_match_the_compiled_structs() {
        for (name, fields) in [
            ("UpdateTable", &UPDATE_TABLE[..]),
            ("ChunkTable", &CHUNK_TABLE[..]),
            ("WeightGradTable", &WEIGHT_GRAD_TABLE[..]),
        ] {
            let (_, size) = layout(fields);
            let expression = format!("sizeof({name})");
            let kernel = kernel_constants("nn", &[], &[expression.as_str()]).unwrap();
            assert_eq!(kernel, [size as i64], "{name}");
        }
    }
}
