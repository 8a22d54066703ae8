"""`--domain-weight DOMAIN=N --corpus PATH`: a training stream that shows each sequence of DOMAIN N times per
epoch (0: never), the other domains once.

The feature cache knows a sequence by its id only (`<record id>/<n>`, train/data.py); the domain (`math`,
`code`, `chat`) is a field of the corpus record the sequence was rendered from, so the corpus the features were
computed from is read once for it. The trainer's shuffled stream then runs over the repeated index list, so a
weight of 3 puts a domain's sequences into a step three times as often, each epoch still seeing every one."""
from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Sequence

from flashmap_ext.train.store import read_records


def domain_weight_arg(text: str) -> tuple[str, int]:
    """argparse type of --domain-weight: "DOMAIN=N" with N an integer >= 0."""
    domain, sep, count = text.partition("=")
    if not sep or not domain or not count.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected DOMAIN=N with N an integer >= 0, e.g. chat=3, got {text!r}")
    return domain.strip(), int(count)


def record_domains(corpora: Sequence[str]) -> dict[str, str]:
    """{record id as text: domain} of every record of the corpus folders or files `corpora` (records without
    a domain are left out; `features` names a record 4 "4/0"). ValueError naming --corpus for a missing path
    or an id given two domains."""
    out: dict[str, str] = {}
    for corpus in corpora:
        if not os.path.exists(corpus):
            raise ValueError(f"--corpus {corpus}: no such file or folder")
        for r in read_records(corpus):
            if "id" not in r or r.get("domain") is None:
                continue
            key = str(r["id"])
            if out.setdefault(key, r["domain"]) != r["domain"]:
                raise ValueError(f"--corpus {corpus}: record {key!r} is of domain {r['domain']!r} there and "
                                 f"{out[key]!r} in an earlier record; one id, one domain")
    return out


class DomainMix(Sequence):
    """`dataset` with each item of a weighted domain repeated `weight` times (items of weight 0 left out).
    `ids`: the dataset's sequence ids (`<record id>/<n>`), in its order; `domains`: {record id: domain}."""

    def __init__(self, dataset: Sequence, ids: Sequence[str], domains: dict[str, str], weights: dict[str, int],
                 corpus: str = "the corpus"):
        names = [domains.get(i.rsplit("/", 1)[0]) for i in ids]
        missing = [i for i, d in zip(ids, names) if d is None]
        if missing:
            raise ValueError(f"--corpus {corpus}: {len(missing)} of the {len(ids)} cached sequences have no record "
                             f"with a domain there (e.g. {missing[0]!r}); give the corpus the features were "
                             "computed from")
        present = set(names)
        absent = sorted(set(weights) - present)
        if absent:
            raise ValueError(f"--domain-weight {absent[0]}: no cached sequence is of that domain (the corpus has "
                             f"{', '.join(sorted(present))})")
        self.dataset, self.domains = dataset, names
        self.index = [i for i, d in enumerate(names) for _ in range(weights.get(d, 1))]
        if not self.index:
            raise ValueError("--domain-weight: every domain has weight 0 (nothing to train on)")

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        return self.dataset[self.index[i]]

    def summary(self) -> str:
        """One line: sequences per domain before and after weighting."""
        before, after = Counter(self.domains), Counter(self.domains[i] for i in self.index)
        return ", ".join(f"{d} {before[d]} -> {after[d]}" for d in sorted(before))


def mixed(dataset, ids: Sequence[str], corpus: Sequence[str] | None, weights: Sequence[tuple[str, int]] | None):
    """`dataset` as the trainer should see it: unchanged without --domain-weight, else a DomainMix (ValueError
    naming --corpus when it is missing, or a domain given twice). `corpus`: the --corpus paths."""
    if not weights:
        if corpus:
            raise ValueError(f"--corpus {corpus[0]}: read only for --domain-weight, which is not given")
        return dataset
    if not corpus:
        raise ValueError("--domain-weight needs --corpus PATH: the corpus the --features were computed from "
                         "(its records name each sequence's domain)")
    table = dict(weights)
    twice = [d for d, n in Counter(d for d, _ in weights).items() if n > 1]
    if twice:
        raise ValueError(f"--domain-weight {twice[0]} is given twice")
    return DomainMix(dataset, ids, record_domains(corpus), table, ", ".join(corpus))
