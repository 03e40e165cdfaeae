"""Bundles are reachable by id and file name only: every other path is 404, whatever it contains."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api import bundles
from supervisor.diagnostics.bundle import write_bundle

BUNDLE = "20250101T000000Z-startup_stall"

TRAVERSALS = [
    b"/diagnostics/..",
    b"/diagnostics/../status",
    b"/diagnostics/%2e%2e",
    b"/diagnostics/%2E%2E/%2E%2E/etc/passwd",
    b"/diagnostics/" + BUNDLE.encode() + b"/..",
    b"/diagnostics/" + BUNDLE.encode() + b"/../" + BUNDLE.encode() + b"/summary.txt",
    b"/diagnostics/" + BUNDLE.encode() + b"/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    b"/diagnostics/" + BUNDLE.encode() + b"/..%2F..%2F..%2Fetc%2Fpasswd",
    b"/diagnostics/" + BUNDLE.encode() + b"/%2Fetc%2Fpasswd",
    b"/diagnostics/" + BUNDLE.encode() + b"//etc/passwd",
    b"/diagnostics//etc/passwd",
    b"/diagnostics/%2Fetc/passwd",
    b"/diagnostics/" + BUNDLE.encode() + b"/summary.txt%00.json",
    b"/diagnostics/" + BUNDLE.encode() + b"/%00",
    b"/diagnostics/" + BUNDLE.encode() + b"/summary.txt%0a",
    b"/diagnostics/" + BUNDLE.encode() + b"/.",
    b"/diagnostics/" + BUNDLE.encode() + b"/.hidden",
    b"/diagnostics/" + BUNDLE.encode() + b"/..%5c..%5cetc%5cpasswd",
    b"/diagnostics/" + BUNDLE.encode() + b"/passwd-link",
    b"/diagnostics/" + BUNDLE.encode() + b"/sibling-link.txt",
    b"/diagnostics/" + BUNDLE.encode() + b"/fifo",
    b"/diagnostics/" + BUNDLE.encode() + b"/subdir",
    b"/diagnostics/linked-bundle/summary.txt",
    b"/diagnostics/linked-bundle",
    b"/diagnostics/.tmp-20250102T000000Z-hung/summary.txt",
    b"/diagnostics/.tmp-20250102T000000Z-hung",
    b"/diagnostics/" + BUNDLE.encode() + b"/" + b"a" * 300,
    b"/diagnostics/%C0%AE%C0%AE/etc/passwd",
]


@pytest.fixture
def hostile_bundles(diag_dir: Path, tmp_path: Path) -> Path:
    """Links, a FIFO and a half-written capture planted where a careless server would serve them."""
    b = diag_dir / BUNDLE
    (b / "passwd-link").symlink_to("/etc/passwd")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret outside the bundle\n")
    (b / "sibling-link.txt").symlink_to(outside)
    os.mkfifo(b / "fifo")
    (b / "subdir").mkdir()
    (b / ".hidden").write_text("hidden\n")
    (diag_dir / "linked-bundle").symlink_to(b)
    tmp = diag_dir / ".tmp-20250102T000000Z-hung"
    tmp.mkdir()
    (tmp / "summary.txt").write_text("in progress\n")
    (tmp / "summary.json").write_text("{}")
    return diag_dir


@pytest.mark.parametrize("target", TRAVERSALS, ids=[t.decode(errors="replace")[:60] for t in TRAVERSALS])
async def test_traversal_is_404(
    make_app: Callable[..., FastAPI], raw: Callable[..., Any], hostile_bundles: Path, target: bytes
) -> None:
    response = await raw(make_app(), "GET", target)
    assert response.status == 404, (target, response)
    assert b"root:" not in response.body
    assert b"secret outside" not in response.body
    assert b"in progress" not in response.body


async def test_bundle_files_are_served(client: httpx.AsyncClient, hostile_bundles: Path) -> None:
    r = await client.get(f"/diagnostics/{BUNDLE}/summary.txt")
    assert (r.status_code, r.text) == (200, f"bundle {BUNDLE}\n")
    assert r.headers["content-type"].startswith("text/plain")
    assert r.headers["x-content-type-options"] == "nosniff"
    r = await client.get(f"/diagnostics/{BUNDLE}/summary.json")
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"cause": "startup_stall", "hang_class": "idle_deadlock"}


async def test_large_file_streams_whole(client: httpx.AsyncClient, diag_dir: Path) -> None:
    data = os.urandom(3 * bundles.CHUNK + 17).hex()
    (diag_dir / BUNDLE / "gdb-4242.txt").write_text(data)
    r = await client.get(f"/diagnostics/{BUNDLE}/gdb-4242.txt")
    assert r.text == data


async def test_listing_hides_links_temp_dirs_and_junk(
    client: httpx.AsyncClient, hostile_bundles: Path, bundle_maker: Callable[..., Path]
) -> None:
    newer = bundle_maker(hostile_bundles, "20250103T000000Z-manual", {"cause": "manual"})
    os.utime(newer, (2_000_000_000, 2_000_000_000))
    broken = hostile_bundles / "20250104T000000Z-broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{torn")
    (hostile_bundles / "stray-file.txt").write_text("not a bundle")
    r = await client.get("/diagnostics")
    assert r.status_code == 200
    listed = r.json()["bundles"]
    ids = [b["id"] for b in listed]
    assert ids[0] == "20250103T000000Z-manual"  # newest first
    assert set(ids) == {BUNDLE, "20250103T000000Z-manual", "20250104T000000Z-broken"}
    by_id = {b["id"]: b for b in listed}
    assert by_id["20250104T000000Z-broken"]["summary"] is None
    assert by_id[BUNDLE]["summary"]["hang_class"] == "idle_deadlock"


async def test_bundle_detail_lists_regular_files_only(client: httpx.AsyncClient, hostile_bundles: Path) -> None:
    r = await client.get(f"/diagnostics/{BUNDLE}")
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == BUNDLE
    assert body["summary"] == {"cause": "startup_stall", "hang_class": "idle_deadlock"}
    assert body["files"] == ["py-spy-4242.txt", "summary.json", "summary.txt"]


async def test_summary_that_is_a_link_is_not_read(client: httpx.AsyncClient, diag_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"stolen": True}))
    b = diag_dir / "20250105T000000Z-linked-summary"
    b.mkdir()
    (b / "summary.json").symlink_to(elsewhere)
    r = await client.get("/diagnostics/20250105T000000Z-linked-summary")
    assert r.json()["summary"] is None
    assert r.json()["files"] == []


async def test_summary_with_nan_is_still_json(client: httpx.AsyncClient, diag_dir: Path) -> None:
    b = diag_dir / "20250106T000000Z-nan"
    b.mkdir()
    (b / "summary.json").write_text('{"gpu_util": NaN, "ok": Infinity}')
    r = await client.get("/diagnostics/20250106T000000Z-nan")
    assert r.status_code == 200
    assert r.json()["summary"] == {"gpu_util": None, "ok": None}


async def test_missing_diag_dir_is_an_empty_list(
    make_app: Callable[..., FastAPI], make_client: Callable[..., httpx.AsyncClient], diag_dir: Path
) -> None:
    for child in diag_dir.iterdir():
        for f in child.iterdir():
            f.unlink()
        child.rmdir()
    diag_dir.rmdir()
    async with make_client(make_app()) as c:
        assert (await c.get("/diagnostics")).json() == {"bundles": []}
        assert (await c.get(f"/diagnostics/{BUNDLE}")).status_code == 404


@pytest.mark.parametrize(
    "name",
    ["ok.txt", "a", "A-1_b.c", "0"],
)
def test_safe_names(name: str) -> None:
    assert bundles.is_safe_name(name)


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", ".x", "-x", "_x", "a/b", "a\\b", "a\x00b", "a\n", "é", "a b", "x" * 256, "/etc/passwd"],
)
def test_unsafe_names(name: str) -> None:
    assert not bundles.is_safe_name(name)


# The reader on its own (it is the only one: the daemon writes bundles, only the API reads them).


def _written(diag_dir: Path, bundle_id: str, age_s: float) -> Path:
    """A bundle as the daemon writes it (supervisor.diagnostics.bundle.write_bundle)."""
    summary = json.dumps({"id": bundle_id, "hang_class": "unknown"}).encode()
    path = write_bundle(diag_dir, bundle_id, {"summary.json": summary, "blob.txt": b"x" * 10})
    at = time.time() - age_s
    os.utime(path, (at, at))
    return path


def _read_fd(fd: int) -> bytes:
    return b"".join(bundles.read_chunks(fd))


def test_reader_lists_what_the_writer_wrote_newest_first(tmp_path: Path) -> None:
    _written(tmp_path, "a", age_s=10)
    _written(tmp_path, "b", age_s=0)
    listed = bundles.list_bundles(tmp_path)
    assert [b.id for b in listed] == ["b", "a"]
    assert listed[0].summary == {"id": "b", "hang_class": "unknown"}
    detail = bundles.bundle_detail(tmp_path, "b")
    assert detail is not None and detail.files == ["blob.txt", "summary.json"]
    fd = bundles.open_bundle_file(tmp_path, "a", "blob.txt")
    assert fd is not None and _read_fd(fd) == b"x" * 10
    assert bundles.list_bundles(tmp_path / "missing") == []
    assert bundles.bundle_detail(tmp_path, "../a") is None


@pytest.mark.parametrize(
    ("bundle_id", "name"),
    [
        ("..", "summary.json"),
        ("a", ".."),
        ("a", "../a/summary.json"),
        ("a/..", "summary.json"),
        ("a", "nope.txt"),
        ("missing", "summary.json"),
        (".tmp-x", "summary.json"),
        ("a", "link.txt"),
        ("linked", "summary.json"),
        ("a", "sub"),
        ("a", ""),
    ],
)
def test_reader_refuses_anything_unsafe(tmp_path: Path, bundle_id: str, name: str) -> None:
    d = _written(tmp_path, "a", age_s=0)
    (d / "sub").mkdir()
    outside = tmp_path.parent / f"outside-{tmp_path.name}.txt"
    outside.write_text("secret")
    (d / "link.txt").symlink_to(outside)
    (tmp_path / "linked").symlink_to(d)
    (tmp_path / ".tmp-x").mkdir()
    (tmp_path / ".tmp-x" / "summary.json").write_text("{}")
    assert bundles.open_bundle_file(tmp_path, bundle_id, name) is None
    assert bundles.open_bundle_file(tmp_path, "a", "summary.json") is not None  # the same bundle, a safe name


def test_a_link_swapped_in_after_listing_is_still_refused(tmp_path: Path) -> None:
    """The descriptor-safe part: a name checked and then replaced by a link is opened O_NOFOLLOW."""
    d = _written(tmp_path, "a", age_s=0)
    detail = bundles.bundle_detail(tmp_path, "a")
    assert detail is not None and "blob.txt" in detail.files
    outside = tmp_path.parent / f"outside-{tmp_path.name}.txt"
    outside.write_text("secret")
    (d / "blob.txt").unlink()
    (d / "blob.txt").symlink_to(outside)
    assert bundles.open_bundle_file(tmp_path, "a", "blob.txt") is None
