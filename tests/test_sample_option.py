"""pytest's --sample (tests/case_sampling.py): every N-th case of each test, per module if asked, each
kept case carrying its N for the FlashInfer summary (scripts/flashinfer_compat.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import case_sampling
import pytest


class _Config:
    def __init__(self, specs):
        self.specs, self.deselected = specs, []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name):
        assert name == "sample"
        return self.specs


def _items(module: str, test: str, n: int):
    return [SimpleNamespace(path=Path(f"/r/tests/flashinfer/{module}.py"), originalname=test,
                            name=f"{test}[{i}]", user_properties=[]) for i in range(n)]


def test_sample_rates_parse_a_default_and_per_module_rates():
    assert case_sampling.sample_rates([]) == (1, {})
    rates = case_sampling.sample_rates(["10", "test_page=1", "test_rope=50"])
    assert rates == (10, {"test_page": 1, "test_rope": 50})
    for bad in ["0", "x", "=3", "test_rope=", "test_rope=-2"]:
        with pytest.raises(pytest.UsageError, match="expected N or MODULE=N"):
            case_sampling.sample_rates([bad])


def test_each_test_keeps_its_first_case_and_every_nth_after_at_its_modules_rate():
    rope, page = _items("test_rope", "test_rope", 7), _items("test_page", "test_page", 3)
    other = _items("test_rope", "test_rope_other", 2)
    items = rope + page + other
    config = _Config(["3", "test_page=1"])
    case_sampling.sampled(config, items)
    assert [i.name for i in items] == ["test_rope[0]", "test_rope[3]", "test_rope[6]",
                                       "test_page[0]", "test_page[1]", "test_page[2]", "test_rope_other[0]"]
    assert len(config.deselected) == 5
    # the rate is recorded where it thinned the module, so the summary can say so
    assert rope[0].user_properties == [("sample", 3)] and page[0].user_properties == []


def test_no_sampling_keeps_everything_untouched():
    items = _items("test_norm", "test_norm", 4)
    case_sampling.sampled(_Config(["test_norm=1"]), items)
    assert len(items) == 4 and all(i.user_properties == [] for i in items)
