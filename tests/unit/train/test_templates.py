"""The model templates a spec may name (spec.MODEL_TEMPLATES, which imports no torch) are those the worker can build."""

from __future__ import annotations

import pytest

from training_platform.spec import MODEL_TEMPLATES, parse_spec
from training_platform.train.templates import TEMPLATES, get_template


def test_the_spec_and_the_worker_name_the_same_templates():
    assert sorted(TEMPLATES) == sorted(MODEL_TEMPLATES)
    for name in MODEL_TEMPLATES:
        assert callable(get_template(name).build_model), name


def test_an_unknown_template_is_refused_with_the_names_to_use():
    with pytest.raises(Exception, match="unknown template 'resnet'; use one of: digits_mlp, gpt"):
        parse_spec({"name": "t", "model": {"template": "resnet"}})
