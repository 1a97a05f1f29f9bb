//! `MtmdBitmap`: an image (RGB pixels) or an audio clip (float samples) for a multimodal prompt.
//!
//! Every bitmap is named at creation by the SHA-256 of its content (its `id`), which mtmd copies
//! into the chunks it tokenizes: the prefix cache recognises the same image by it, as llama.cpp's
//! server does with its own hash.

use std::borrow::Cow;
use std::fmt::Write;
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use llama_cpp_4::mtmd::MtmdBitmap;
use numpy::ndarray::{ArrayView, Dimension};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use sha2::{Digest, Sha256};

use crate::backend::explained;
use crate::errors::python::{foreign, to_py};
use crate::errors::{Error, Result};
use crate::gil::detached;
use crate::media::audio_file::{self, MAX_SAMPLES};
use crate::media::image_file::{self, image_error, DEFAULT_MAX_PIXELS};
use crate::paths::existing_file;

/// Audio shorter than this many samples is refused: llama.cpp's mel spectrogram asserts on a
/// clip of under two frames (0.1 s at 16 kHz is well above that).
const MIN_AUDIO_SAMPLES: usize = 1600;

/// The elements of `array` in order: borrowed when they lie so in memory, else copied into memory
/// asked for without aborting (`MemoryError` when there is none: a Rust allocation that fails ends
/// the process).
fn contiguous<'a, T: Copy, D: Dimension>(array: &'a ArrayView<'_, T, D>) -> Result<Cow<'a, [T]>> {
    if let Some(elements) = array.as_slice() {
        return Ok(Cow::Borrowed(elements));
    }
    let mut elements = Vec::new();
    elements.try_reserve_exact(array.len()).map_err(|_| {
        foreign(PyMemoryError::new_err(format!(
            "no memory for a copy of {} array elements",
            array.len()
        )))
    })?;
    elements.extend(array.iter().copied());
    Ok(Cow::Owned(elements))
}

/// An image or an audio clip, ready for `MtmdContext.tokenize`.
#[pyclass(frozen, module = "llamactx", name = "MtmdBitmap")]
pub struct PyMtmdBitmap {
    bitmap: RwLock<MtmdBitmap>,
}

impl PyMtmdBitmap {
    /// Names `bitmap` by the hash of its kind, size and `content` (which feeds the hash).
    fn named(mut bitmap: MtmdBitmap, kind: &str, content: impl FnOnce(&mut Sha256)) -> Result<Self> {
        let mut hash = Sha256::new();
        hash.update(kind.as_bytes());
        hash.update(bitmap.nx().to_le_bytes());
        hash.update(bitmap.ny().to_le_bytes());
        content(&mut hash);
        let id = hash.finalize().iter().fold(String::with_capacity(64), |mut id, byte| {
            let _ = write!(id, "{byte:02x}");
            id
        });
        bitmap.set_id(&id).map_err(|err| Error::value(err.to_string()))?;
        Ok(Self {
            bitmap: RwLock::new(bitmap),
        })
    }

    fn rgb(width: u32, height: u32, pixels: &[u8]) -> Result<Self> {
        image_file::check_size(width, height, u64::MAX)?;
        // `mtmd_bitmap_init` copies width * height * 3 bytes: checked here, not by the crate.
        let expected = u64::from(width) * u64::from(height) * 3;
        if u64::try_from(pixels.len()).ok() != Some(expected) {
            return Err(Error::value(format!(
                "{width}x{height} RGB pixels are {expected} bytes, got {}",
                pixels.len()
            )));
        }
        let bitmap = explained(|| MtmdBitmap::from_rgb(width, height, pixels))?;
        Self::named(bitmap, "rgb", |hash| hash.update(pixels))
    }

    fn audio(samples: &[f32]) -> Result<Self> {
        if !(MIN_AUDIO_SAMPLES..=MAX_SAMPLES).contains(&samples.len()) {
            return Err(Error::value(format!(
                "audio must hold {MIN_AUDIO_SAMPLES} to {MAX_SAMPLES} samples, got {}",
                samples.len()
            )));
        }
        if samples.iter().any(|sample| !sample.is_finite()) {
            return Err(Error::value("audio samples must be finite"));
        }
        let bitmap = explained(|| MtmdBitmap::from_audio(samples))?;
        Self::named(bitmap, "audio", |hash| {
            // The samples' bytes in blocks: a copy of a ten-minute clip would be 38 MB.
            let mut block = [0u8; 4 * 1024];
            for samples in samples.chunks(block.len() / 4) {
                for (bytes, sample) in block.chunks_exact_mut(4).zip(samples) {
                    bytes.copy_from_slice(&sample.to_le_bytes());
                }
                hash.update(&block[..samples.len() * 4]);
            }
        })
    }

    /// The bitmap, for reading (tokenizing reads it only).
    pub fn read(&self) -> RwLockReadGuard<'_, MtmdBitmap> {
        self.bitmap.read().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl PyMtmdBitmap {
    /// An image from an `(height, width, 3)` uint8 array of RGB pixels (copied).
    #[classmethod]
    fn from_rgb(_cls: &Bound<'_, PyType>, image: PyReadonlyArrayDyn<'_, u8>) -> PyResult<Self> {
        let shape = image.shape();
        let [height, width, 3] = *shape else {
            return Err(to_py(Error::value(format!(
                "an RGB image is an array of shape (height, width, 3), got {shape:?}"
            ))));
        };
        let side = |value: usize| u32::try_from(value).map_err(|_| image_error("TooLarge", "the image is too large"));
        let (width, height) = (side(width).map_err(to_py)?, side(height).map_err(to_py)?);
        Self::rgb(width, height, &contiguous(&image.as_array()).map_err(to_py)?).map_err(to_py)
    }

    /// An image decoded from the bytes of a PNG, JPEG, GIF or BMP file, or an audio clip from
    /// a WAV file, by Rust decoders (not llama.cpp's). `ImageError` for an image refused: not
    /// one of the formats, an animation, a truncated or malformed file, or more than
    /// `max_pixels` pixels (checked in the header, before decoding); `ValueError` for
    /// `max_pixels` above 2**27. A WAV file is mixed down to mono and resampled to
    /// `sample_rate` (the projector's `audio_sample_rate()`); `AudioError` for one refused.
    #[classmethod]
    #[pyo3(signature = (data, *, max_pixels = DEFAULT_MAX_PIXELS, sample_rate = 16_000))]
    fn from_buf(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        data: &[u8],
        max_pixels: u64,
        sample_rate: u32,
    ) -> PyResult<Self> {
        detached(py, || {
            if audio_file::is_wav(data) {
                return Self::audio(&audio_file::decode(data, sample_rate)?);
            }
            let rgb = image_file::decode(data, max_pixels)?;
            Self::rgb(rgb.width, rgb.height, &rgb.pixels)
        })
    }

    /// An image or audio clip read from a file, as `from_buf`.
    #[classmethod]
    #[pyo3(signature = (path, *, max_pixels = DEFAULT_MAX_PIXELS, sample_rate = 16_000))]
    fn from_file(
        cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        max_pixels: u64,
        sample_rate: u32,
    ) -> PyResult<Self> {
        let path = existing_file(path)?;
        let data = detached(py, || {
            std::fs::read(&path).map_err(|err| Error::value(format!("{}: {err}", path.display())))
        })?;
        Self::from_buf(cls, py, &data, max_pixels, sample_rate)
    }

    /// An audio clip from mono float32 samples at the projector's `audio_sample_rate()`
    /// (copied); from 0.1 s to ten minutes at 16 kHz, every sample finite.
    #[classmethod]
    fn from_audio(_cls: &Bound<'_, PyType>, samples: PyReadonlyArray1<'_, f32>) -> PyResult<Self> {
        Self::audio(&contiguous(&samples.as_array()).map_err(to_py)?).map_err(to_py)
    }

    /// Width in pixels (for audio, the number of samples).
    fn nx(&self) -> u32 {
        self.read().nx()
    }

    /// Height in pixels (1 for audio).
    fn ny(&self) -> u32 {
        self.read().ny()
    }

    /// Size of the pixel or sample data in bytes.
    fn n_bytes(&self) -> usize {
        self.read().n_bytes()
    }

    /// Whether this is an audio clip.
    fn is_audio(&self) -> bool {
        self.read().is_audio()
    }

    /// A copy of the content: an `(ny, nx, 3)` uint8 array for an image, float32 samples for
    /// audio.
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let bitmap = self.read();
        if bitmap.is_audio() {
            let samples: Vec<f32> = bitmap
                .data()
                .chunks_exact(4)
                .map(|bytes| f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                .collect();
            return Ok(PyArray1::from_vec(py, samples).into_any());
        }
        let shape = [bitmap.ny() as usize, bitmap.nx() as usize, 3];
        Ok(PyArray1::from_slice(py, bitmap.data()).reshape(shape)?.into_any())
    }

    /// The bitmap's name in the chunks it becomes: the SHA-256 of its content unless `set_id`
    /// changed it.
    fn id(&self) -> Option<String> {
        self.read().id().map(str::to_owned)
    }

    /// Names the bitmap (chunks tokenized from it afterwards carry `id`).
    fn set_id(&self, id: &str) -> PyResult<()> {
        let mut bitmap = self.bitmap.write().unwrap_or_else(PoisonError::into_inner);
        bitmap
            .set_id(id)
            .map_err(|_| to_py(Error::value("id must not contain NUL characters")))
    }

    fn __repr__(&self) -> String {
        let bitmap = self.read();
        if bitmap.is_audio() {
            format!("MtmdBitmap(audio, {} samples)", bitmap.nx())
        } else {
            format!("MtmdBitmap(image, {}x{})", bitmap.nx(), bitmap.ny())
        }
    }
}
