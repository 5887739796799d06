"""A reward's own config files given by path (open_clip_config.json, BLIP's med_config.json, the BERT
vocab.txt): a FIFO is named and never opened, a document that is not one JSON object or not UTF-8 is
refused naming the field, the file and what to point it at — never a TypeError or UnicodeDecodeError."""

from __future__ import annotations

import os

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.rewards.hps import HPSv21
from g2rpo.rewards.image_reward import ImageReward, load_blip_tokenizer


@pytest.fixture
def files(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "null.json").write_text("null\n")
    (tmp_path / "weights.pt").write_bytes(b"not read: the config is checked first")
    return tmp_path


def test_an_open_clip_config_that_is_a_fifo_or_not_an_object_is_named(files):
    with pytest.raises(G2RPOError, match=r"hps_v21\.open_clip_config=.*is a FIFO \(named pipe\), not a regular file"):
        HPSv21.from_checkpoint(files / "weights.pt", open_clip_config=files / "pipe.json")
    with pytest.raises(G2RPOError, match=r"null\.json' holds null where an object belongs: pass an open_clip_config"):
        HPSv21.from_checkpoint(files / "weights.pt", open_clip_config=files / "null.json")


def test_a_med_config_that_is_a_fifo_is_named(files):
    with pytest.raises(G2RPOError, match=r"image_reward\.med_config=.*is a FIFO \(named pipe\).*BLIP's med_config"):
        ImageReward.from_checkpoint(files / "weights.pt", med_config=files / "pipe.json", tokenizer_dir=files)


def test_a_vocabulary_that_is_not_utf8_is_named_with_its_line(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\ncaf\xe9\n")
    with pytest.raises(G2RPOError, match=r"vocabulary .*vocab\.txt': line 3, column 4: byte 0xe9 is not UTF-8"):
        load_blip_tokenizer(tmp_path)


def test_rewards_score_names_a_directory_fifo_or_decompression_bomb_given_as_an_image(tmp_path, capsys):
    from PIL import Image

    from g2rpo.cli import main

    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "dir.png").mkdir()
    bomb = tmp_path / "bomb.png"
    Image.new("1", (20_000, 20_000)).save(bomb)  # 400 M pixels, ~50 KB on disk: past PIL's 179 M limit
    for name, message in (
        ("pipe.png", "is a FIFO (named pipe), not an image file"),
        ("dir.png", "is a directory, not an image file"),
        ("bomb.png", "is not a readable image (Image size (400000000 pixels) exceeds limit"),
    ):
        assert main(["rewards", "score", "jpeg_compressibility", str(tmp_path / name), "--prompt", "x"]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
