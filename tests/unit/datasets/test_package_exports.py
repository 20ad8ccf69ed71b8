"""The datasets package loads each of its names on first use: every name it exports resolves, and nothing else."""

import pytest

import training_platform.datasets as datasets


def test_every_exported_name_resolves_to_its_module():
    for name in datasets.__all__:
        value = getattr(datasets, name)
        assert value.__module__.startswith("training_platform.datasets."), (name, value.__module__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'build_snapshots'"):
        datasets.build_snapshots  # noqa: B018 - the access is the test
