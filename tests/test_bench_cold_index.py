"""The cold index benchmark's trees and CPU readings: a wheel becomes the tree its
package installs (less its metadata and translation catalogs), and a process that is
not the benchmark's child is read from /proc."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

from bench.cold_index import _proc_cpu, materialize


def test_a_wheel_tree_drops_its_metadata_and_locale_folders(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/__init__.py", "VALUE = 1\n")
        z.writestr("pkg/conf/locale/de/formats.py", "DATE = 'd.m.Y'\n")
        z.writestr("pkg/conf/locale/de/LC_MESSAGES/django.po", 'msgid "x"\n')
        z.writestr("pkg/templates/page.html", "<p>{{ x }}</p>\n")
        z.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\n")
    tree, sources = materialize(f"wheel:{wheel}", tmp_path / "tree")
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert files == ["pkg/__init__.py", "pkg/templates/page.html"]
    assert sources[wheel.name].startswith("sha256:")


def test_a_folder_is_used_where_it_is(tmp_path: Path) -> None:
    tree, sources = materialize(str(tmp_path), tmp_path / "unused")
    assert tree == tmp_path.resolve() and not (tmp_path / "unused").exists()
    assert sources == {"folder": str(tmp_path.resolve())}


def test_cpu_seconds_of_a_running_process_and_none_once_it_is_gone() -> None:
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.5: pass\n"
                             "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        seen = 0.0
        while seen < 0.4 and time.monotonic() < deadline:
            seen = _proc_cpu(busy.pid) or 0.0
            time.sleep(0.05)
        assert 0.4 <= seen < 5
    finally:
        busy.kill()
        busy.wait()
    assert _proc_cpu(busy.pid) is None
