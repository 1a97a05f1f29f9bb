//! WAV files from untrusted sources (a chat request's `input_audio`), decoded in Rust: their bytes
//! never reach llama.cpp's C decoders (miniaudio inside mtmd). PCM of 8, 16, 24 or 32 bits and
//! 32-bit float, any channel count up to 8 (mixed down to mono), resampled linearly to the
//! projector's rate. Every size is bounded before anything is allocated: the clip's length from
//! its frame count and rate, and the resampled clip's from that and the rate asked for (one
//! second asked for at 4 GHz took 16 GB, and a failed allocation aborts the process).

use std::ops::RangeInclusive;

use crate::errors::{Error, ExcClass, Result};

/// The longest clip: ten minutes.
const MAX_SECONDS: u32 = 600;
/// The most samples a clip may hold at the projector's rate: ten minutes at 16 kHz, the rate
/// of the Whisper-style encoders mtmd reads audio with.
pub const MAX_SAMPLES: usize = 16_000 * MAX_SECONDS as usize;
/// The sample rates read, a file's or the one asked for (768 kHz is the highest any audio
/// interface records at).
const RATES: RangeInclusive<u32> = 1..=768_000;

/// Whether `bytes` start as a WAV file does.
pub fn is_wav(bytes: &[u8]) -> bool {
    bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WAVE"
}

/// Decodes a WAV file to mono float samples at `sample_rate`. `ValueError` for a `sample_rate`
/// outside 1..=768000; `AudioError` with `kind` `NotAudio` (not RIFF/WAVE), `Unsupported` (a
/// compressed or odd format), `TooLong` (over ten minutes, or over `MAX_SAMPLES` samples once
/// resampled), `Empty` or `Corrupt` (truncated, malformed).
pub fn decode(bytes: &[u8], sample_rate: u32) -> Result<Vec<f32>> {
    if !is_wav(bytes) {
        return Err(audio_error(
            "NotAudio",
            format!("the data ({} bytes) is not a WAV file", bytes.len()),
        ));
    }
    if !RATES.contains(&sample_rate) {
        return Err(Error::value(format!(
            "sample_rate must be in {}..={} Hz, got {sample_rate}",
            RATES.start(),
            RATES.end()
        )));
    }
    let WavChunks { format, data } = chunks(&bytes[12..])?;
    let layout = Layout::read(format)?;
    let frames = data.len() / layout.frame_bytes();
    if frames == 0 {
        return Err(audio_error("Empty", "the WAV file holds no samples"));
    }
    let count = resampled_len(frames, layout.rate, sample_rate)?;
    let mono: Vec<f32> = data
        .chunks_exact(layout.frame_bytes())
        .map(|frame| {
            let sum: f32 = frame
                .chunks_exact(layout.sample_bytes())
                .map(|sample| layout.value(sample))
                .sum();
            sum / f32::from(layout.channels)
        })
        .collect();
    Ok(resample(mono, layout.rate, sample_rate, count))
}

/// How many samples `frames` at `from` Hz become at `to` Hz; `TooLong` past ten minutes or
/// `MAX_SAMPLES`. Computed from the header alone, before any sample is decoded or allocated.
fn resampled_len(frames: usize, from: u32, to: u32) -> Result<usize> {
    let frames = u128::try_from(frames).unwrap_or(u128::MAX);
    let (from, to) = (u128::from(from), u128::from(to));
    if frames > u128::from(MAX_SECONDS) * from {
        return Err(audio_error(
            "TooLong",
            format!(
                "the audio lasts over {} s, more than the limit of {MAX_SECONDS} s",
                frames / from
            ),
        ));
    }
    let count = frames * to / from;
    match usize::try_from(count) {
        Ok(count) if count <= MAX_SAMPLES => Ok(count),
        _ => Err(audio_error(
            "TooLong",
            format!("the audio is {count} samples at {to} Hz, more than the limit of {MAX_SAMPLES}"),
        )),
    }
}

pub fn audio_error(kind: &'static str, message: impl Into<String>) -> Error {
    Error::llama(ExcClass::AudioError, kind, None, message)
}

/// The contents of a WAV file's two chunks that matter.
struct WavChunks<'a> {
    format: &'a [u8],
    data: &'a [u8],
}

/// The `fmt ` and `data` chunks' contents (a truncated data chunk is cut to what is there).
fn chunks(mut rest: &[u8]) -> Result<WavChunks<'_>> {
    let (mut format, mut data) = (None, None);
    while rest.len() >= 8 {
        let length = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        let body = &rest[8..];
        let content = &body[..length.min(body.len())];
        match &rest[..4] {
            b"fmt " => format = Some(content),
            b"data" => data = Some(content),
            _ => {}
        }
        // Chunks are padded to an even length.
        let next = length.saturating_add(length & 1);
        if next >= body.len() {
            break;
        }
        rest = &body[next..];
    }
    let format = format.ok_or_else(|| audio_error("Corrupt", "the WAV file has no fmt chunk"))?;
    if format.len() < 16 {
        return Err(audio_error("Corrupt", "the WAV file's fmt chunk is truncated"));
    }
    let data = data.ok_or_else(|| audio_error("Corrupt", "the WAV file has no data chunk"))?;
    Ok(WavChunks { format, data })
}

/// How the samples are stored.
struct Layout {
    float: bool,
    bits: u16,
    channels: u16,
    rate: u32,
}

impl Layout {
    fn read(format: &[u8]) -> Result<Self> {
        let word = |at: usize| u16::from_le_bytes([format[at], format[at + 1]]);
        let mut tag = word(0);
        // WAVE_FORMAT_EXTENSIBLE: the real format is the sub-format GUID's first two bytes.
        if tag == 0xFFFE && format.len() >= 26 {
            tag = word(24);
        }
        let layout = Self {
            float: tag == 3,
            bits: word(14),
            channels: word(2),
            rate: u32::from_le_bytes([format[4], format[5], format[6], format[7]]),
        };
        let supported = match tag {
            1 => matches!(layout.bits, 8 | 16 | 24 | 32),
            3 => layout.bits == 32,
            _ => false,
        };
        if !supported {
            return Err(audio_error(
                "Unsupported",
                format!(
                    "WAV format {tag} with {} bits per sample is not read: send PCM (8, 16, 24 or 32 bits) or \
                     32-bit float",
                    layout.bits
                ),
            ));
        }
        if !(1..=8).contains(&layout.channels) || !RATES.contains(&layout.rate) {
            return Err(audio_error(
                "Unsupported",
                format!("{} channels at {} Hz is not read", layout.channels, layout.rate),
            ));
        }
        Ok(layout)
    }

    fn sample_bytes(&self) -> usize {
        usize::from(self.bits / 8)
    }

    fn frame_bytes(&self) -> usize {
        self.sample_bytes() * usize::from(self.channels)
    }

    /// One sample in -1..=1.
    #[allow(clippy::cast_precision_loss)]
    fn value(&self, bytes: &[u8]) -> f32 {
        match (self.float, bytes) {
            (true, &[a, b, c, d]) => {
                let value = f32::from_le_bytes([a, b, c, d]);
                if value.is_finite() {
                    value.clamp(-1.0, 1.0)
                } else {
                    0.0
                }
            }
            (false, &[a]) => (f32::from(a) - 128.0) / 128.0,
            (false, &[a, b]) => f32::from(i16::from_le_bytes([a, b])) / 32_768.0,
            (false, &[a, b, c]) => (i32::from_le_bytes([0, a, b, c]) >> 8) as f32 / 8_388_608.0,
            (false, &[a, b, c, d]) => i32::from_le_bytes([a, b, c, d]) as f32 / 2_147_483_648.0,
            _ => 0.0,
        }
    }
}

/// `samples` at `from` Hz, linearly interpolated to `count` samples at `to` Hz (`count` from
/// `resampled_len`).
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn resample(samples: Vec<f32>, from: u32, to: u32, count: usize) -> Vec<f32> {
    if from == to || samples.is_empty() {
        return samples;
    }
    let step = f64::from(from) / f64::from(to);
    let last = samples.len() - 1;
    (0..count)
        .map(|index| {
            let at = index as f64 * step;
            let before = (at.floor() as usize).min(last);
            let after = (before + 1).min(last);
            let weight = (at - before as f64) as f32;
            samples[before] * (1.0 - weight) + samples[after] * weight
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav(format: u16, bits: u16, channels: u16, rate: u32, data: &[u8]) -> Vec<u8> {
        let mut out = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&format.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        let align = channels * bits / 8;
        out.extend_from_slice(&(rate * u32::from(align)).to_le_bytes());
        out.extend_from_slice(&align.to_le_bytes());
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn decodes_pcm_and_mixes_channels_down() {
        let stereo: Vec<u8> = [16_384i16, -16_384, 32_767, 32_767]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let samples = decode(&wav(1, 16, 2, 16_000, &stereo), 16_000).unwrap();
        assert_eq!(samples.len(), 2);
        assert!(samples[0].abs() < 1e-6);
        assert!((samples[1] - 1.0).abs() < 1e-3);
        let float: Vec<u8> = [0.5f32, -0.25].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            decode(&wav(3, 32, 1, 16_000, &float), 16_000).unwrap(),
            vec![0.5, -0.25]
        );
    }

    #[test]
    fn resamples_to_the_projector_rate() {
        let data: Vec<u8> = (0..48_000).flat_map(|_| 1000i16.to_le_bytes()).collect();
        let samples = decode(&wav(1, 16, 1, 48_000, &data), 16_000).unwrap();
        assert_eq!(samples.len(), 16_000);
    }

    #[test]
    fn refuses_what_it_must() {
        let kind = |result: Result<Vec<f32>>| match result {
            Err(Error::Llama { kind, .. }) => kind,
            _ => "no audio error".to_owned(),
        };
        assert_eq!(kind(decode(b"hello", 16_000)), "NotAudio");
        assert_eq!(kind(decode(&wav(2, 4, 1, 16_000, &[0; 8]), 16_000)), "Unsupported");
        assert_eq!(kind(decode(&wav(1, 16, 0, 16_000, &[0; 8]), 16_000)), "Unsupported");
        assert_eq!(kind(decode(&wav(1, 16, 1, 16_000, &[]), 16_000)), "Empty");
        let long = wav(1, 8, 1, 1, &[0; 700]);
        assert_eq!(kind(decode(&long, 16_000)), "TooLong");
        let header_only = &wav(1, 16, 1, 16_000, &[0; 8])[..20];
        assert_eq!(kind(decode(header_only, 16_000)), "Corrupt");
    }

    #[test]
    fn sizes_are_refused_before_anything_is_allocated() {
        let kind = |result: Result<Vec<f32>>| match result {
            Err(Error::Llama { kind, .. }) => kind,
            Err(Error::Value(_)) => "ValueError".to_owned(),
            _ => "no error".to_owned(),
        };
        let second = wav(1, 16, 1, 16_000, &vec![0; 32_000]);
        // 16,000 frames asked at 4 GHz: 4e12 samples once resampled.
        assert_eq!(kind(decode(&second, 4_000_000_000)), "ValueError");
        assert_eq!(kind(decode(&second, 0)), "ValueError");
        // Ten minutes at 1 Hz asked at 768 kHz: 460,800,000 samples, past MAX_SAMPLES.
        assert_eq!(kind(decode(&wav(1, 8, 1, 1, &[0; 600]), 768_000)), "TooLong");
        assert_eq!(
            decode(&wav(1, 8, 1, 1, &[0; 600]), 16_000).map(|s| s.len()).ok(),
            Some(MAX_SAMPLES)
        );
        // Ten minutes and half a second: past the limit, not rounded down to it.
        assert_eq!(kind(decode(&wav(1, 8, 1, 2, &[0; 1201]), 2)), "TooLong");
        assert_eq!(resampled_len(16_000, 16_000, 48_000).ok(), Some(48_000));
    }
}
