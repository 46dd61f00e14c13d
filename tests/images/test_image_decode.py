"""The image decoding core: every bad-image class gets its status or correct handling, with a clear message."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from pipeline.images import decode as decode_module
from pipeline.images.decode import ImageRejected, decode_image, read_image_bytes, resize_center_crop
from tests.support import image_samples as samples


def test_doctests():
    assert doctest.testmod(decode_module).failed == 0


def test_good_jpeg_and_png_decode_to_rgb():
    for data, fmt in ((samples.jpeg(0), "JPEG"), (samples.png(0), "PNG")):
        img = decode_image(data)
        assert (img.width, img.height, img.format, img.notes) == (96, 64, fmt, ())
        assert img.array.dtype == np.uint8 and img.array.shape == (64, 96, 3)
    # the PNG is lossless: exactly the pixels written
    assert np.array_equal(decode_image(samples.png(0)).array, samples.pattern(0))


@pytest.mark.parametrize("key,status,words", [
    ("null", "skipped_null", "null"),
    ("empty", "skipped_empty", "0 bytes"),
    ("not_image", "invalid_image", "not an image"),
    ("truncated", "invalid_image", "truncated or corrupt JPEG"),
])
def test_unusable_inputs_are_rejected_with_status(key, status, words):
    with pytest.raises(ImageRejected) as err:
        decode_image(samples.bad_image_set()[key] if key != "null" else None)
    assert err.value.status == status
    assert words in str(err.value)


def test_decompression_bomb_refused_from_the_header():
    bomb = samples.png_bomb()  # a valid 30,000 x 30,000 PNG, under 1 MB
    assert len(bomb) < 2_000_000
    with pytest.raises(ImageRejected) as err:
        decode_image(bomb)
    assert err.value.status == "too_large"
    assert "decompression bomb" in str(err.value)
    # below Pillow's own limit, our max_pixels guard names the size and the setting
    with pytest.raises(ImageRejected) as err:
        decode_image(samples.png_bomb(2000), max_pixels=1_000_000)
    assert err.value.status == "too_large"
    assert "2,000 x 2,000 = 4,000,000 pixels" in str(err.value) and "task.max_pixels" in str(err.value)
    assert decode_image(samples.png_bomb(2000), max_pixels=4_000_000).width == 2000


def test_cmyk_converted_to_rgb():
    img = decode_image(samples.cmyk_jpeg())
    assert img.mode == "CMYK" and "cmyk->rgb" in img.notes
    # colours survive the round trip through CMYK (JPEG loss aside)
    diff = np.abs(img.array.astype(int) - samples.pattern(2).astype(int)).mean()
    assert diff < 12, diff


def test_16bit_png_scaled_not_clipped():
    img = decode_image(samples.png16(40000))
    assert "16bit->8bit" in img.notes
    # 40000/65535*255 = 155.6 -> 156 (Pillow's own conversion would clip to 255: a white image)
    assert np.unique(img.array).tolist() == [156]


def test_animated_gif_uses_first_frame():
    img = decode_image(samples.animated_gif(3))
    assert img.format == "GIF" and "animated:first of 3 frames" in img.notes
    first = decode_image(samples.animated_gif(1))
    assert np.array_equal(img.array, first.array)


def test_exif_rotation_applied():
    data, upright = samples.exif_rotated_jpeg(6)
    img = decode_image(data)
    assert (img.width, img.height) == (96, 64)  # stored 64 x 96, displayed upright
    assert "exif:orientation 6" in img.notes
    assert np.abs(img.array.astype(int) - upright.astype(int)).mean() < 6


def test_transparency_composited_on_white():
    img = decode_image(samples.rgba_png())
    assert "alpha->white" in img.notes and np.unique(img.array).tolist() == [255]


def test_read_image_bytes_local_path_and_uri(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(samples.png(1))
    assert read_image_bytes(str(path)) == samples.png(1)
    assert read_image_bytes(path.as_uri()) == samples.png(1)
    with pytest.raises(ImageRejected) as err:
        read_image_bytes(str(tmp_path / "missing.png"))
    assert err.value.status == "missing_file"


def test_resize_center_crop_geometry():
    image = np.zeros((100, 300, 3), np.uint8)
    image[:, 140:160] = 255  # a bright bar in the centre survives the centre crop
    out = resize_center_crop(image, 32)
    assert out.shape == (32, 32, 3)
    assert out[:, 16].min() > 200 and out[:, 0].max() == 0


def _tiff(sizes: list[tuple[int, int]], shades: list[int]) -> bytes:
    import io

    from PIL import Image

    pages = [Image.new("L", size, shade) for size, shade in zip(sizes, shades)]
    out = io.BytesIO()
    pages[0].save(out, "TIFF", save_all=True, append_images=pages[1:])
    return out.getvalue()


def test_a_multipage_tiff_decodes_every_page_within_the_page_and_pixel_limits():
    from pipeline.images.decode import decode_pages

    data = _tiff([(40, 30), (50, 20), (60, 10)], [10, 120, 250])
    first_only = decode_image(data)  # the image tasks: the first page, named as one of three
    assert first_only.notes == ("animated:first of 3 frames",) and first_only.more_pages == ()
    every = decode_pages(data, max_pages=10)
    assert (every.width, every.height, every.notes, every.pages_left_out) == (40, 30, ("pages:3",), 0)
    assert [p.shape for p in every.more_pages] == [(20, 50, 3), (10, 60, 3)]
    assert [int(p[0, 0, 0]) for p in (every.array, *every.more_pages)] == [10, 120, 250]  # in page order
    by_count = decode_pages(data, max_pages=2)
    assert (len(by_count.more_pages), by_count.pages_left_out, by_count.notes) == (1, 1, ("pages:2 of 3",))
    # 1,200 + 1,000 pixels fit a limit of 2,500; the third page's 600 would not: memory stays one image's
    by_pixels = decode_pages(data, max_pixels=2_500, max_pages=10)
    assert (len(by_pixels.more_pages), by_pixels.pages_left_out, by_pixels.notes) == (1, 1, ("pages:2 of 3",))
    single = decode_pages(_tiff([(40, 30)], [0]), max_pages=10)
    assert (single.more_pages, single.notes, single.pages_left_out) == ((), (), 0)
    gif = decode_pages(samples.animated_gif(), max_pages=10)  # frames of an animation are not pages
    assert gif.more_pages == () and gif.notes[0].startswith("animated:first of")
