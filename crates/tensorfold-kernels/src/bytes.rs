//! Host byte ranges (mapped files, embedded bytes, owned copies) and typed matrix views over them.

use std::sync::Arc;

/// Element type of a weight tensor as stored in a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16 (1 sign, 8 exponent, 7 mantissa bits); widened to f32 by a 16-bit shift, exactly.
    Bf16,
    /// IEEE binary32.
    F32,
    /// 8-bit affine codes (MLX's affine quantization): element `i` of a row is
    /// `code[i] * scale[g] + bias[g]` for its group `g = i / group`, computed as one f32 FMA. One byte a code:
    /// MLX's uint32 words of four codes, first in the low bits, are these bytes in little-endian order.
    Q8,
    /// 4-bit affine codes (MLX's affine quantization at 4 bits): two codes a byte, element `2i` in the low nibble
    /// of byte `i` and `2i + 1` in the high one (MLX's uint32 words of eight codes, first in the low bits, read as
    /// little-endian bytes); each element is `fma(code, scale[g], bias[g])` in f32 as [`Dtype::Q8`].
    Q4,
}

impl Dtype {
    /// Bytes per element of the unpacked dtypes (a [`Dtype::Q4`] element is half a byte: use [`Dtype::bytes`]).
    pub fn size(self) -> usize {
        match self {
            Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::Q8 | Dtype::Q4 => 1,
        }
    }

    /// Bytes of `elems` elements; `None` on overflow or a Q4 run of odd length (half a byte).
    pub fn bytes(self, elems: usize) -> Option<usize> {
        match self {
            Dtype::Q4 => elems.is_multiple_of(2).then_some(elems / 2),
            d => elems.checked_mul(d.size()),
        }
    }

    /// Whether the elements are affine codes with per-group scales and biases.
    pub fn is_affine(self) -> bool {
        matches!(self, Dtype::Q8 | Dtype::Q4)
    }

    /// Bits of one code of an affine dtype (8 or 4); `None` for the float dtypes.
    pub fn code_bits(self) -> Option<u32> {
        match self {
            Dtype::Q8 => Some(8),
            Dtype::Q4 => Some(4),
            _ => None,
        }
    }
}

/// A read-only byte range whose owner (a memory map, a `'static` slice, an owned buffer) is kept alive
/// by reference counting, so weight views are zero-copy and a refused open frees everything on drop.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBytes({} bytes)", self.len)
    }
}

/// Owned bytes with 4-byte alignment, so f32 and bf16 views are always valid.
struct Aligned(Vec<u32>, usize);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
}

impl HostBytes {
    /// Wraps `owner[start..start + len]`. Returns `None` when the range is out of bounds.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (start.checked_add(len)? <= total).then_some(Self { owner, start, len })
    }

    /// Copies `data` into an owned, 4-byte aligned buffer.
    pub fn copy_from(data: &[u8]) -> Self {
        let mut words = vec![0u32; data.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..data.len()].copy_from_slice(data);
        Self { owner: Arc::new(Aligned(words, data.len())), start: 0, len: data.len() }
    }

    /// The first `len` bytes of `words`, without a copy. `None` when `len` exceeds the words' bytes.
    pub fn from_words(words: Vec<u32>, len: usize) -> Option<Self> {
        (len <= words.len() * 4).then(|| Self { owner: Arc::new(Aligned(words, len)), start: 0, len })
    }

    /// Owned bytes of an f32 vector (little-endian, as in safetensors).
    pub fn from_f32(data: &[f32]) -> Self {
        Self::copy_from(bytemuck::cast_slice(data))
    }

    /// Owned bytes of a bf16 vector given as raw u16 bit patterns.
    pub fn from_bf16_bits(data: &[u16]) -> Self {
        Self::copy_from(bytemuck::cast_slice(data))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-range of these bytes (zero-copy). `None` when out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> Option<Self> {
        (start.checked_add(len)? <= self.len).then(|| Self {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        })
    }

    /// These bytes, aligned to `align` (a copy only when the range is misaligned).
    pub fn aligned(self, align: usize) -> Self {
        if (self.as_slice().as_ptr() as usize).is_multiple_of(align) { self } else { Self::copy_from(self.as_slice()) }
    }
}

/// A row-major weight matrix `[rows, cols]` (`rows` outputs of `cols` inputs each, as torch's
/// `nn.Linear.weight`) in host memory.
#[derive(Clone, Debug)]
pub struct MatView {
    /// Output features (rows of the matrix).
    pub rows: usize,
    /// Input features (columns).
    pub cols: usize,
    /// Element type of `bytes`.
    pub dtype: Dtype,
    /// `rows * cols * dtype.size()` bytes, aligned to the element size.
    pub bytes: HostBytes,
    /// Scales and biases of a [`Dtype::Q8`] or [`Dtype::Q4`] matrix; `None` otherwise.
    pub affine: Option<Affine>,
}

/// Per-group scales and biases of an affine-quantized matrix: f32 `[rows, cols / group]` each.
#[derive(Clone, Debug)]
pub struct Affine {
    /// Elements a group (dividing `cols`).
    pub group: usize,
    /// f32 scales, row-major.
    pub scales: HostBytes,
    /// f32 biases, row-major.
    pub biases: HostBytes,
}

impl MatView {
    /// Checks that the byte length matches the shape and aligns the bytes to the element size.
    pub fn new(rows: usize, cols: usize, dtype: Dtype, bytes: HostBytes) -> Option<Self> {
        (rows.checked_mul(cols)?.checked_mul(dtype.size())? == bytes.len())
            .then(|| Self { rows, cols, dtype, bytes: bytes.aligned(dtype.size()), affine: None })
            .filter(|_| !dtype.is_affine())
    }

    /// An affine-quantized matrix over its codes (zero-copy): `codes` are `rows * cols` codes of `dtype` (Q8 or Q4,
    /// packed as [`Dtype::Q4`] says), `affine` holds f32 scales and biases `[rows, cols / group]`. `None` when a
    /// length disagrees with the shape, the group does not divide `cols`, or `dtype` is not affine.
    pub fn quantized(rows: usize, cols: usize, dtype: Dtype, codes: HostBytes, affine: Affine) -> Option<Self> {
        let g = affine.group;
        let groups = rows.checked_mul(cols.checked_div(g)?)?;
        let ok = dtype.is_affine()
            && cols.is_multiple_of(g)
            && dtype.bytes(cols)?.checked_mul(rows)? == codes.len()
            && affine.scales.len() == groups * 4
            && affine.biases.len() == groups * 4;
        let affine = Affine { group: g, scales: affine.scales.aligned(4), biases: affine.biases.aligned(4) };
        ok.then_some(Self { rows, cols, dtype, bytes: codes, affine: Some(affine) })
    }

    /// An f32 matrix from values (for tests and the contract).
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Self {
        assert_eq!(rows * cols, data.len(), "MatView::from_f32 shape");
        Self { rows, cols, dtype: Dtype::F32, bytes: HostBytes::from_f32(data), affine: None }
    }

    /// A bf16 matrix from raw bit patterns (for tests and the contract).
    pub fn from_bf16_bits(rows: usize, cols: usize, data: &[u16]) -> Self {
        assert_eq!(rows * cols, data.len(), "MatView::from_bf16_bits shape");
        Self { rows, cols, dtype: Dtype::Bf16, bytes: HostBytes::from_bf16_bits(data), affine: None }
    }

    /// Rows `[start, start + count)` as their own matrix (zero-copy).
    pub fn row_range(&self, start: usize, count: usize) -> Option<Self> {
        let row_bytes = self.dtype.bytes(self.cols)?;
        let affine = match &self.affine {
            Some(a) => {
                let gb = self.cols / a.group * 4;
                let (at, len) = (start.checked_mul(gb)?, count.checked_mul(gb)?);
                Some(Affine { group: a.group, scales: a.scales.slice(at, len)?, biases: a.biases.slice(at, len)? })
            }
            None => None,
        };
        Some(Self {
            rows: count,
            cols: self.cols,
            dtype: self.dtype,
            bytes: self.bytes.slice(start.checked_mul(row_bytes)?, count.checked_mul(row_bytes)?)?,
            affine,
        })
    }

    /// Element `(r, c)` widened to f32 (slow; for references and tests).
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let i = r * self.cols + c;
        let b = self.bytes.as_slice();
        match self.dtype {
            Dtype::F32 => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap_or([0; 4])),
            Dtype::Bf16 => f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16),
            Dtype::Q8 | Dtype::Q4 => {
                let a = self.affine.as_ref().expect("an affine matrix has scales and biases");
                let g = r * (self.cols / a.group) + c / a.group;
                let f = |h: &HostBytes| bytemuck::cast_slice::<u8, f32>(h.as_slice())[g];
                let code = if self.dtype == Dtype::Q8 { b[i] } else { (b[i / 2] >> (4 * (i % 2))) & 15 };
                (code as f32).mul_add(f(&a.scales), f(&a.biases))
            }
        }
    }

    /// The matrix quantized to 8-bit affine codes in groups of `group` columns ([`MatView::quantize_affine`]).
    pub fn quantize_q8(&self, group: usize) -> Option<Self> {
        self.quantize_affine(Dtype::Q8, group)
    }

    /// The matrix quantized to affine codes of `dtype` (Q8 or Q4) in groups of `group` columns (MLX's affine
    /// scheme, min-max form: per group, `scale = (max - min) / (2^bits - 1)`, `bias = min`,
    /// `code = round((w - bias) / scale)`). `None` when `group` does not divide `cols` or `dtype` is not affine.
    pub fn quantize_affine(&self, dtype: Dtype, group: usize) -> Option<Self> {
        let top = ((1u32 << dtype.code_bits()?) - 1) as f32;
        if group == 0 || !self.cols.is_multiple_of(group) {
            return None;
        }
        let w = self.to_f32();
        let mut codes = vec![0u8; w.len()];
        let (mut scales, mut biases) = (Vec::new(), Vec::new());
        for (gi, chunk) in w.chunks(group).enumerate() {
            let (lo, hi) = chunk.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let scale = (hi - lo) / top;
            for (k, &v) in chunk.iter().enumerate() {
                codes[gi * group + k] = if scale > 0.0 { ((v - lo) / scale).round().clamp(0.0, top) as u8 } else { 0 };
            }
            scales.push(scale);
            biases.push(lo);
        }
        let packed = match dtype {
            Dtype::Q4 => codes.chunks(2).map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4)).collect(),
            _ => codes,
        };
        let affine = Affine { group, scales: HostBytes::from_f32(&scales), biases: HostBytes::from_f32(&biases) };
        Self::quantized(self.rows, self.cols, dtype, HostBytes::copy_from(&packed), affine)
    }

    /// All elements widened to f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        if self.dtype.is_affine() {
            return (0..self.rows)
                .flat_map(|r| (0..self.cols).map(move |c| (r, c)))
                .map(|(r, c)| self.get(r, c))
                .collect();
        }
        match self.dtype {
            Dtype::F32 => bytemuck::cast_slice::<u8, f32>(self.bytes.as_slice()).to_vec(),
            Dtype::Bf16 => bytemuck::cast_slice::<u8, u16>(self.bytes.as_slice())
                .iter()
                .map(|&h| f32::from_bits((h as u32) << 16))
                .collect(),
            Dtype::Q8 | Dtype::Q4 => unreachable!("handled above"),
        }
    }
}
