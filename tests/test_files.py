"""ds2_jax.files: rewritten files are whole (atomic) and get the mode any program's open() gives them.

issue 40: tempfile.mkstemp made every rewritten file 0600 whatever the umask, so another user of a
shared data_dir or a shared run could not read config.json, eval results, metrics.jsonl,
config_changes.jsonl or the data record. Each of the package's writers is run here for real.
"""

import json
import os

import pytest

from ds2_jax import files, metrics, settings, workdir_config


@pytest.fixture(params=[0o022, 0o002, 0o077])
def mask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_umask_is_read_without_changing_it(mask):
    assert files.umask() == mask and files.umask() == mask
    assert os.umask(mask) == mask


def test_every_rewriting_writer_gives_a_new_file_the_umasks_mode_like_open(tmp_path, mask):
    want = 0o666 & ~mask
    plain = tmp_path / "plain"
    with open(plain, "w") as f:  # what any other program gets
        f.write("x")
    assert mode(plain) == want
    files.write_text(str(tmp_path / "a.txt"), "a")
    config = settings.Settings()
    workdir_config.save_config(config, str(tmp_path))  # config.json
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    os.chmod(tmp_path / "metrics.jsonl", want)
    metrics._drop_records_after(str(tmp_path / "metrics.jsonl"), 2)  # a resume's rewrite
    workdir_config.record_resume_changes(settings.override(config, {"optimizer.learning_rate": 1e-3}), str(tmp_path), 5)
    for name in ("a.txt", "config.json", "metrics.jsonl", "config_changes.jsonl"):
        assert mode(tmp_path / name) == want, name
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1, 2]


def test_a_rewritten_file_keeps_its_own_mode(tmp_path, mask):
    path = tmp_path / "shared.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    files.write_text(str(path), "new")
    assert path.read_text() == "new" and mode(path) == 0o640
