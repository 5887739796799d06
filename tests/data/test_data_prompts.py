"""Prompt files: reading, validation with line numbers, dedupe, deterministic split, `g2rpo data prep`."""

from __future__ import annotations

import hashlib
import json

import pytest

from g2rpo.artifacts.manifest import read_manifest
from g2rpo.artifacts.storage import FileStore, sha256_file
from g2rpo.cli import main
from g2rpo.data import dedupe_prompts, prepare_prompts, read_prompt_file, read_prompt_split, split_prompts
from g2rpo.errors import G2RPOError


def test_data_read_txt_strips_and_keeps_order(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"  a cat \r\nthe sea\n\tnight city\n")  # CRLF and a final newline are fine
    assert read_prompt_file(f) == ["a cat", "the sea", "night city"]
    g = tmp_path / "bom.txt"
    g.write_bytes(b"\xef\xbb\xbfcaf\xc3\xa9 au lait")  # BOM, no final newline, UTF-8 é
    assert read_prompt_file(g) == ["café au lait"]


def test_data_read_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": " a dog ", "id": 7}\n{"prompt": "a bird"}\n', encoding="utf-8")
    assert read_prompt_file(f) == ["a dog", "a bird"]


def test_data_empty_lines_are_errors_with_line_numbers(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a cat\n\nthe sea\n   \nend\n", encoding="utf-8")
    with pytest.raises(G2RPOError) as info:
        read_prompt_file(f)
    msg = str(info.value)
    assert "2 bad line(s)" in msg
    assert f"{f}:2: empty prompt" in msg and f"{f}:4: empty prompt" in msg
    assert "remove the line" in msg


def test_data_non_utf8_is_an_error_with_line_and_column(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"fine\ncaf\xe9 latin-1\nalso fine\n")  # 0xe9 is é in latin-1, invalid UTF-8 here
    with pytest.raises(G2RPOError) as info:
        read_prompt_file(f)
    msg = str(info.value)
    assert f"{f}:2: not UTF-8 (byte 0xe9 at column 4)" in msg
    assert "UTF-8" in msg and "iconv" in msg
    assert "1 bad line(s)" in msg


def test_data_jsonl_problems_are_listed_together(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\nnot json\n{"prompt": ""}\n["a"]\n', encoding="utf-8")
    with pytest.raises(G2RPOError) as info:
        read_prompt_file(f)
    msg = str(info.value)
    assert "4 bad line(s)" in msg
    assert f"{f}:2: no string field 'prompt'" in msg
    assert f"{f}:3: not valid JSON" in msg
    assert f"{f}:4: empty prompt" in msg
    assert f"{f}:5: no string field 'prompt'" in msg


def test_data_missing_or_empty_file(tmp_path):
    with pytest.raises(G2RPOError, match="file not found"):
        read_prompt_file(tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(G2RPOError, match="holds no prompts"):
        read_prompt_file(tmp_path / "empty.txt")


def test_data_dedupe_counts():
    # a, b, a, c, b, a → unique a, b, c (first occurrences, in order); 3 dropped
    assert dedupe_prompts(["a", "b", "a", "c", "b", "a"]) == (["a", "b", "c"], 3)
    assert dedupe_prompts(["x"]) == (["x"], 0)


def test_data_split_is_deterministic_and_order_independent():
    prompts = [f"prompt {i}" for i in range(50)]
    train, test = split_prompts(prompts, 10, seed=1)
    assert len(test) == 10 and len(train) == 40
    assert sorted(train + test) == sorted(prompts)
    # test = the 10 smallest sha256(f"{seed}\0{prompt}") keys, in input order
    keys = sorted(prompts, key=lambda p: hashlib.sha256(f"1\x00{p}".encode()).digest())
    assert set(test) == set(keys[:10])
    assert test == [p for p in prompts if p in set(test)]
    # reversing the file does not change which prompts are held out
    train_r, test_r = split_prompts(prompts[::-1], 10, seed=1)
    assert set(test_r) == set(test)
    assert set(split_prompts(prompts, 10, seed=2)[1]) != set(test)
    # a fraction: 0.1 of 50 = 5
    assert len(split_prompts(prompts, 0.1, seed=1)[1]) == 5
    assert split_prompts(prompts, 0, seed=1) == (prompts, [])


@pytest.mark.parametrize("bad", [50, 51, -1, 1.5, -0.5])
def test_data_split_rejects_impossible_sizes(bad):
    with pytest.raises(G2RPOError, match="test_size"):
        split_prompts([f"p{i}" for i in range(50)], bad)


def test_data_prepare_writes_splits_and_manifest_last(tmp_path):
    src = tmp_path / "prompts.txt"
    src.write_text("".join(f"prompt {i % 12}\n" for i in range(15)), encoding="utf-8")  # 12 unique, 3 duplicates
    out = tmp_path / "out"
    summary = prepare_prompts(src, out, test_size=2, seed=0)
    assert (summary.read, summary.duplicates, summary.train, summary.test) == (15, 3, 10, 2)
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["index"] for r in train] == list(range(10))
    assert read_prompt_split(out / "train.jsonl") == [r["prompt"] for r in train]
    manifest = read_manifest(FileStore(out))  # the manifest every artifact carries
    assert {f.path: (f.size, f.sha256) for f in manifest.files} == {
        name: sha256_file(out / name) for name in ("train.jsonl", "test.jsonl")
    }
    assert manifest.metadata["kind"] == "prompt-split" and manifest.metadata["summary"]["duplicates"] == 3
    # existing outputs are not replaced without --overwrite, and stay as they were
    before = (out / "train.jsonl").read_bytes()
    with pytest.raises(G2RPOError, match="--overwrite"):
        prepare_prompts(src, out, test_size=3)
    assert (out / "train.jsonl").read_bytes() == before
    assert prepare_prompts(src, out, test_size=3, overwrite=True).test == 3


def test_data_prep_cli(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(8)), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["data", "prep", "--prompts", str(src), "--output", str(out), "--test-size", "0.25"]) == 0
    assert "8 prompts read, 0 duplicate(s) dropped: 6 train, 2 test" in capsys.readouterr().out
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\n")
    assert main(["data", "prep", "--prompts", str(bad), "--output", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: empty prompt" in err
    assert not (tmp_path / "o2").exists()  # nothing written for a bad file


def test_data_prompt_file_from_s3(tmp_path, s3_env):
    client = s3_env.server.client()
    client.put_object(
        Bucket=s3_env.bucket,
        Key="sets/hps.jsonl",
        Body=b'{"prompt": "a cat"}\n{"prompt": "a dog"}\n{"prompt": "a cat"}\n',
    )
    summary = prepare_prompts(f"{s3_env.uri}/sets/hps.jsonl", tmp_path / "out", test_size=1)
    assert (summary.read, summary.duplicates, summary.train, summary.test) == (3, 1, 1, 1)
    client.put_object(Bucket=s3_env.bucket, Key="sets/bad.txt", Body=b"fine\n\n")
    with pytest.raises(G2RPOError, match=f"{s3_env.uri}/sets/bad.txt:2: empty prompt"):
        prepare_prompts(f"{s3_env.uri}/sets/bad.txt", tmp_path / "out2")
    with pytest.raises(G2RPOError, match="does not exist"):
        prepare_prompts(f"{s3_env.uri}/sets/none.txt", tmp_path / "out3")
