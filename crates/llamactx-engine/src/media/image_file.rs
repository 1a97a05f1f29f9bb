//! Image files from untrusted sources (a chat request's base64 data), decoded in Rust under
//! limits. Their bytes never reach llama.cpp's C decoders (stb_image inside mtmd): the format is
//! recognised from its signature, the dimensions read from the header and bounded before any
//! pixel is decoded, the decoder's allocations capped, and animations refused (llama.cpp would
//! silently keep the first frame).

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::errors::{Error, ExcClass, Result};

/// The default bound on an image's pixels: 8192 x 4096 (llama.cpp's projectors resize every
/// image to at most a few megapixels anyway).
pub const DEFAULT_MAX_PIXELS: u64 = 1 << 25;

/// The most `max_pixels` may be: 2^27 pixels decode to 512 MiB of 8-bit RGBA.
pub const MAX_PIXELS_CEILING: u64 = 1 << 27;

/// The longest side any decoder is allowed to allocate for.
const MAX_SIDE: u32 = 1 << 16;

/// A decoded image: `width * height` RGB pixels, row by row.
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Decodes a PNG, JPEG, GIF or BMP file of at most `max_pixels` pixels (`ValueError` above
/// `MAX_PIXELS_CEILING`) to RGB (alpha dropped, as
/// stb_image does when asked for three channels). `ImageError` with `kind` `NotAnImage`,
/// `Animated`, `TooLarge`, `Empty` (zero width or height) or `Corrupt` (truncated or malformed).
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Rgb> {
    if max_pixels > MAX_PIXELS_CEILING {
        return Err(Error::value(format!(
            "max_pixels may be at most {MAX_PIXELS_CEILING}, got {max_pixels}"
        )));
    }
    let format = sniff(bytes)?;
    let animated = match format {
        ImageFormat::Png => png_is_animated(bytes),
        ImageFormat::Gif => gif_has_frames_after_first(bytes),
        _ => false,
    };
    if animated {
        return Err(image_error(
            "Animated",
            "animated images are not supported: send one frame",
        ));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits(max_pixels));
    let decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    check_size(width, height, max_pixels)?;
    let pixels = DynamicImage::from_decoder(decoder)
        .map_err(corrupt)?
        .into_rgb8()
        .into_raw();
    Ok(Rgb { width, height, pixels })
}

/// `ImageError` unless `width x height` is a non-empty image of at most `max_pixels` pixels.
pub fn check_size(width: u32, height: u32, max_pixels: u64) -> Result<()> {
    if width == 0 || height == 0 {
        return Err(image_error(
            "Empty",
            format!("the image is {width}x{height} pixels: it has no pixels"),
        ));
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(image_error(
            "TooLarge",
            format!("the image is {width}x{height} = {pixels} pixels, more than the limit of {max_pixels}"),
        ));
    }
    Ok(())
}

pub fn image_error(kind: &'static str, message: impl Into<String>) -> Error {
    Error::llama(ExcClass::ImageError, kind, None, message)
}

fn corrupt(err: image::ImageError) -> Error {
    match err {
        image::ImageError::Limits(_) => image_error("TooLarge", format!("the image is too large to decode: {err}")),
        _ => image_error("Corrupt", format!("the image could not be decoded: {err}")),
    }
}

/// What the decoders may allocate: the RGBA buffer of `max_pixels` at 16 bits per channel, and
/// no side longer than `MAX_SIDE`.
fn limits(max_pixels: u64) -> Limits {
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(max_pixels.saturating_mul(8).max(1 << 20));
    limits
}

/// The format from the file's signature; only the four formats llama.cpp's users send.
fn sniff(bytes: &[u8]) -> Result<ImageFormat> {
    const SIGNATURES: [(&[u8], ImageFormat); 5] = [
        (b"\x89PNG\r\n\x1a\n", ImageFormat::Png),
        (b"\xff\xd8\xff", ImageFormat::Jpeg),
        (b"GIF87a", ImageFormat::Gif),
        (b"GIF89a", ImageFormat::Gif),
        (b"BM", ImageFormat::Bmp),
    ];
    SIGNATURES
        .iter()
        .find(|(signature, _)| bytes.starts_with(signature))
        .map(|&(_, format)| format)
        .ok_or_else(|| {
            image_error(
                "NotAnImage",
                format!(
                    "the data ({} bytes) is not a PNG, JPEG, GIF or BMP image (nor a WAV file)",
                    bytes.len()
                ),
            )
        })
}

/// Whether a PNG declares an animation (APNG's `acTL` chunk, which precedes the image data).
fn png_is_animated(bytes: &[u8]) -> bool {
    let mut at = 8usize;
    while let Some(header) = bytes.get(at..at.saturating_add(8)) {
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        match &header[4..8] {
            b"acTL" => return true,
            b"IDAT" | b"IEND" => return false,
            _ => {}
        }
        // Chunk header, data and CRC.
        at = at
            .saturating_add(12)
            .saturating_add(usize::try_from(length).unwrap_or(usize::MAX));
    }
    false
}

/// Whether a GIF holds a second image, walking its blocks. A malformed structure ends the walk:
/// the decoder then reports it.
fn gif_has_frames_after_first(bytes: &[u8]) -> bool {
    let colour_table = |packed: u8| {
        if packed & 0x80 != 0 {
            3usize << ((packed & 7) + 1)
        } else {
            0
        }
    };
    let Some(&screen) = bytes.get(10) else {
        return false;
    };
    let mut at = 13 + colour_table(screen);
    let mut frames = 0;
    loop {
        match bytes.get(at) {
            Some(0x2C) => {
                frames += 1;
                if frames > 1 {
                    return true;
                }
                let Some(&packed) = bytes.get(at + 9) else {
                    return false;
                };
                // Descriptor, local colour table, LZW code size, then the image's sub-blocks.
                at += 10 + colour_table(packed) + 1;
            }
            // Extension: introducer, label, then sub-blocks.
            Some(0x21) => at += 2,
            _ => return false,
        }
        match skip_sub_blocks(bytes, at) {
            Some(next) => at = next,
            None => return false,
        }
    }
}

/// The offset after a run of GIF sub-blocks (each a length byte and that many bytes, ended by
/// a zero length).
fn skip_sub_blocks(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let length = usize::from(*bytes.get(at)?);
        at += 1;
        if length == 0 {
            return Some(at);
        }
        at += length;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(format: ImageFormat, width: u32, height: u32) -> Vec<u8> {
        let image = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([u8::try_from(x).unwrap(), u8::try_from(y).unwrap(), 7])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image).write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    fn kind(result: Result<Rgb>) -> String {
        match result {
            Err(Error::Llama { kind, .. }) => kind,
            Err(_) => "another error".to_owned(),
            Ok(_) => "decoded".to_owned(),
        }
    }

    #[test]
    fn decodes_lossless_formats_exactly() {
        for format in [ImageFormat::Png, ImageFormat::Bmp, ImageFormat::Gif] {
            let rgb = decode(&encoded(format, 5, 3), 100).unwrap();
            assert_eq!((rgb.width, rgb.height), (5, 3));
            if format != ImageFormat::Gif {
                assert_eq!(&rgb.pixels[..6], &[0, 0, 7, 1, 0, 7]);
            }
        }
    }

    #[test]
    fn refuses_what_it_must() {
        assert_eq!(kind(decode(b"hello", 100)), "NotAnImage");
        assert_eq!(kind(decode(&encoded(ImageFormat::Png, 20, 20), 399)), "TooLarge");
        let png = encoded(ImageFormat::Png, 20, 20);
        assert_eq!(kind(decode(&png[..png.len() / 2], 1000)), "Corrupt");
        let jpeg = encoded(ImageFormat::Jpeg, 16, 16);
        assert_eq!(kind(decode(&jpeg[..3], 1000)), "Corrupt");
    }

    #[test]
    fn finds_animations() {
        let mut apng = encoded(ImageFormat::Png, 2, 2);
        // An acTL chunk after IHDR (8 signature + 25 IHDR bytes); its CRC is not checked here.
        let actl = [0, 0, 0, 8, b'a', b'c', b'T', b'L', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0];
        apng.splice(33..33, actl);
        assert!(png_is_animated(&apng));
        assert!(!png_is_animated(&encoded(ImageFormat::Png, 2, 2)));
        let gif = encoded(ImageFormat::Gif, 2, 2);
        assert!(!gif_has_frames_after_first(&gif));
        let mut twice = Vec::new();
        {
            let frame = || image::Frame::new(image::RgbaImage::new(2, 2));
            let mut encoder = image::codecs::gif::GifEncoder::new(&mut twice);
            encoder.encode_frames([frame(), frame()]).unwrap();
        }
        assert!(gif_has_frames_after_first(&twice));
        assert_eq!(kind(decode(&twice, 100)), "Animated");
    }
}
