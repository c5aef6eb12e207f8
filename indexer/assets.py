"""Text files that are not what anyone searches, told from their path and size alone.

A search index of a repository is for its code and its docs. Some text files are
neither, and embedding them fills results with noise and makes a first index slower:

- SVG images (path data: `M12.5 3.1L...`), whatever folder they sit in;
- translations: `.po` and XLIFF catalogs, each the project's messages again in one
  more language (the `.pot` template, in the source language, stays);
- data: csv, tsv and the line-per-record JSON formats, anywhere; JSON and XML over
  `LARGE_DATA_BYTES` (a config file is small; a large one holds records), except the
  config files named in `CONFIG_NAMES`; and in a data folder (`fixtures/`, `testdata/`,
  `data/`, ... at any depth) every file that is neither code nor prose, whatever its
  name (a `package.json` under `fixtures/` is a test input, not the project's config);
- vendored code: folders such as `vendor/` and `third_party/`, skipped whole;
- bundles: `*.bundle.js` anywhere and built JavaScript and CSS under `dist/`.

Nothing here opens a file. The walk (indexer.walk) applies these rules unless a
`.codeveilignore` negation names the file (or, for a vendored folder, the folder).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from indexer.languages import CONFIG_LANGUAGES, language_for_path
from indexer.skip_reasons import SkipReason

# A folder of records or test inputs: in it, only code and prose are indexed.
DATA_DIRS: Final = frozenset(
    {"fixtures", "fixture", "__fixtures__", "testdata", "test_data", "test-data", "data",
     "datasets"}
)
# Someone else's code, copied in: skipped whole.
VENDORED_DIRS: Final = frozenset(
    {"vendor", "vendored", "_vendor", "third_party", "third-party", "thirdparty",
     "3rdparty", "bower_components", "extern", "cextern"}
)
# Build output: the JavaScript and CSS in it were built from sources indexed elsewhere.
BUNDLE_DIRS: Final = frozenset({"dist"})
BUNDLE_EXTENSIONS: Final = frozenset({"js", "mjs", "cjs", "css"})
BUNDLE_SUFFIXES: Final = (".bundle.js", ".bundle.mjs", ".bundle.cjs", ".bundle.css")

SVG_EXTENSIONS: Final = frozenset({"svg"})
TRANSLATION_EXTENSIONS: Final = frozenset({"po", "xlf", "xliff"})
DATA_EXTENSIONS: Final = frozenset({"csv", "tsv", "psv", "jsonl", "ndjson", "geojson",
                                    "topojson"})
# Config or data: told apart by name, folder and size.
MARKUP_EXTENSIONS: Final = frozenset({"json", "xml"})
LARGE_DATA_BYTES: Final = 64 * 1024

# JSON and XML files that configure a project, kept whatever their size outside data
# folders. Names starting with a dot (`.eslintrc.json`, `.babelrc.json`) and those of
# the families in CONFIG_PREFIXES count too.
CONFIG_NAMES: Final = frozenset(
    {
        # JavaScript and TypeScript
        "package.json", "jsconfig.json", "deno.json", "lerna.json", "nx.json",
        "project.json", "angular.json", "turbo.json", "vercel.json", "firebase.json",
        "app.json", "manifest.json", "biome.json", "renovate.json", "bower.json",
        "components.json", "vite.config.json",
        # other ecosystems
        "composer.json", "pyrightconfig.json", "cspell.json", "devcontainer.json",
        "launch.json", "settings.json", "tasks.json", "extensions.json",
        "appsettings.json", "global.json", "packages.config.json",
        # XML
        "pom.xml", "androidmanifest.xml", "build.xml", "web.xml", "phpunit.xml",
        "checkstyle.xml", "logback.xml", "log4j2.xml", "ivy.xml", "settings.xml",
        "persistence.xml", "beans.xml", "plugin.xml", "ruleset.xml",
    }
)
CONFIG_PREFIXES: Final = ("tsconfig", "appsettings.", "phpunit.", "eslint", "prettier",
                          "babel", "jest.config", "renovate")

IN_DATA_DIR: Final = 1
IN_BUNDLE_DIR: Final = 2


def dir_flags(parent: int, name: str) -> int:
    """The flags of a folder called `name` inside one with flags `parent`."""
    lower = name.lower()
    if lower in DATA_DIRS:
        parent |= IN_DATA_DIR
    if lower in BUNDLE_DIRS:
        parent |= IN_BUNDLE_DIR
    return parent


def flags_for(dir_names: Iterable[str]) -> int:
    """The flags of the folder reached through `dir_names` from the root."""
    flags = 0
    for name in dir_names:
        flags = dir_flags(flags, name)
    return flags


def is_vendored_dir(name: str) -> bool:
    return name.lower() in VENDORED_DIRS


def place_reason(name: str, flags: int) -> tuple[SkipReason, str] | None:
    """The reason to skip file `name` in a folder with `flags`, and a detail, or None."""
    # Called for every file the walk lists: the common case costs one suffix test.
    if name.endswith(BUNDLE_SUFFIXES):
        return SkipReason.BUNDLE, ""
    if not flags:
        return None
    if flags & IN_DATA_DIR and not _is_code_or_prose(name):
        return SkipReason.DATA, "in a data folder"
    if flags & IN_BUNDLE_DIR and name.rpartition(".")[2].lower() in BUNDLE_EXTENSIONS:
        return SkipReason.BUNDLE, "in dist/"
    return None


def size_reason(name: str, size: int) -> tuple[SkipReason, str] | None:
    """The reason to skip file `name` of `size` bytes, and a detail, or None."""
    if size <= LARGE_DATA_BYTES:
        return None
    lower = name.lower()
    ext = lower.rpartition(".")[2]
    if ext not in MARKUP_EXTENSIONS or is_config_name(lower):
        return None
    return SkipReason.DATA, f"{ext} over {LARGE_DATA_BYTES // 1024} KiB"


def is_config_name(name: str) -> bool:
    """Whether a JSON or XML file called `name` configures a project."""
    lower = name.lower()
    return lower in CONFIG_NAMES or lower.startswith((".", *CONFIG_PREFIXES))


def _is_code_or_prose(name: str) -> bool:
    language = language_for_path(name)
    if language is None or language in CONFIG_LANGUAGES:
        return False
    if language == "text":  # plain text in a data folder is data, but its README is not
        return name.lower().startswith("readme")
    return True  # code, or markdown and reStructuredText
