"""The write-once layer cache's keys (builder/oci/step_cache.py): what a step reads decides its key, and
a file's content is hashed once while its identity on disk stays."""

import os

import pytest

from builder.oci import step_cache


def _tree(root):
    (root / "d").mkdir(parents=True)
    (root / "d" / "a.txt").write_text("a\n")
    os.symlink("a.txt", root / "d" / "link")
    return root


def test_a_tree_digest_follows_content_mode_names_and_links(tmp_path):
    memo = step_cache.DigestMemo(tmp_path / "memo.json")
    root = _tree(tmp_path / "t")
    first = step_cache.tree_digest(root, memo)
    assert step_cache.tree_digest(root, memo) == first
    changes = [
        lambda: (root / "d" / "a.txt").write_text("b\n"),
        lambda: os.chmod(root / "d" / "a.txt", 0o755),
        lambda: (root / "d" / "a.txt").rename(root / "d" / "b.txt"),
        lambda: (os.unlink(root / "d" / "link"), os.symlink("elsewhere", root / "d" / "link")),
    ]
    seen = {first}
    for change in changes:
        change()
        digest = step_cache.tree_digest(root, memo)
        assert digest not in seen
        seen.add(digest)


def test_a_file_is_hashed_once_while_its_identity_stays(tmp_path, monkeypatch):
    root = _tree(tmp_path / "t")
    memo = step_cache.DigestMemo(tmp_path / "memo.json")
    step_cache.tree_digest(root, memo)
    memo.save()
    hashed = []
    monkeypatch.setattr(step_cache, "sha256_file", lambda path: hashed.append(path) or "0" * 64)
    again = step_cache.DigestMemo(tmp_path / "memo.json")
    step_cache.tree_digest(root, again)
    assert hashed == []  # the saved memo answered
    (root / "d" / "a.txt").write_text("a much longer content\n")  # another size: hashed anew
    step_cache.tree_digest(root, again)
    assert hashed == [root / "d" / "a.txt"]


def test_a_damaged_memo_is_only_a_cold_start(tmp_path):
    (tmp_path / "memo.json").write_text("{not json")
    memo = step_cache.DigestMemo(tmp_path / "memo.json")
    assert step_cache.tree_digest(_tree(tmp_path / "t"), memo)


def test_keys_chain_so_a_change_reaches_every_later_step():
    base = step_cache.first_key("sha256:" + "1" * 64, 1767225600)
    assert base != step_cache.first_key("sha256:" + "1" * 64, 1767225601)
    one = step_cache.chain(base, "COPY a /a", "x")
    assert step_cache.chain(one, "RUN b") != step_cache.chain(step_cache.chain(base, "COPY a /a", "y"), "RUN b")
    # Parts are separated: moving text between them changes the key.
    assert step_cache.chain(base, "ab", "c") != step_cache.chain(base, "a", "bc")


def test_the_step_cache_keeps_what_was_recorded_and_ignores_what_it_cannot_read(tmp_path):
    cache = step_cache.StepCache(tmp_path)
    key = "a" * 64
    assert cache.get(key) is None
    cache.record(key, step_cache.CachedLayer("sha256:" + "b" * 64, 10240))
    assert cache.get(key) == step_cache.CachedLayer("sha256:" + "b" * 64, 10240)
    (tmp_path / step_cache.KEY_FORMAT / key).write_text("{torn")
    assert cache.get(key) is None
    with pytest.raises(ValueError, match="not a step key"):
        cache.get("../../etc/passwd")
