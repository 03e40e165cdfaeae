"""Finding a writable cgroup v2 directory, and saying why not."""

from __future__ import annotations

from pathlib import Path

from supervisor.process.cgroup import CgroupRoot, _cgroup2_mount, _own_cgroup

MOUNTINFO = (
    "22 1 0:21 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "30 22 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
)


def test_mount_and_membership_are_parsed(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/system.slice/sglang-supervisor.service\n")
    assert _cgroup2_mount(str(tmp_path / "mountinfo")) == Path("/sys/fs/cgroup/unified")
    assert _own_cgroup(str(tmp_path / "cgroup")) == "/system.slice/sglang-supervisor.service"
    assert _cgroup2_mount(str(tmp_path / "absent")) is None


def test_no_cgroup2_or_not_a_cgroup_directory_says_why(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(MOUNTINFO.splitlines()[0] + "\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    root, why = CgroupRoot.find(mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "cgroup"))
    assert root is None and why == "no cgroup2 mount"
    assert "not a cgroup v2 directory" in CgroupRoot(tmp_path).check()


def test_an_unwritable_cgroup_directory_says_why(tmp_path: Path) -> None:
    d = tmp_path / "cg"
    d.mkdir()
    (d / "cgroup.procs").write_text("")
    d.chmod(0o555)
    try:
        why = CgroupRoot(d).check()
    finally:
        d.chmod(0o755)
    # root may create the probe directory anyway, but a plain directory has no cgroup.kill in it
    assert why.startswith("cannot create a cgroup") or "cgroup.kill" in why
