"""The nodes named by one AMQP URL setting (shared.infra.broker.node_urls)."""

from __future__ import annotations

import pytest

from shared.infra.broker import node_urls


def test_one_url_is_one_node() -> None:
    assert node_urls("amqp://guest:guest@127.0.0.1:5672/") == ["amqp://guest:guest@127.0.0.1:5672/"]


def test_commas_separate_the_nodes_of_a_cluster_in_order() -> None:
    url = "amqp://u:p@10.0.0.1:5672/v, amqp://u:p@10.0.0.2:5672/v,amqp://u:p@10.0.0.3:5672/v"
    assert node_urls(url) == [
        "amqp://u:p@10.0.0.1:5672/v",
        "amqp://u:p@10.0.0.2:5672/v",
        "amqp://u:p@10.0.0.3:5672/v",
    ]


def test_empty_entries_are_ignored() -> None:
    assert node_urls(",amqp://a/,,") == ["amqp://a/"]


@pytest.mark.parametrize("url", ["", " , ,"])
def test_no_url_is_an_error(url: str) -> None:
    with pytest.raises(ValueError, match="no AMQP URL"):
        node_urls(url)
