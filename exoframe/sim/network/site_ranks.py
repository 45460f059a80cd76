"""Which site each rank is in: the ranks a network's sites list, checked, and the others
spread over the sites that list none (netconfig.py's NetConfig reads it)."""
from __future__ import annotations


def check_listed_ranks(sites: dict, error) -> None:
    """Check the ranks sites list: non-negative integers, each in one site once.
    error(path, problem): the ExoframeError naming the file and field."""
    owner: dict[int, str] = {}
    for site, config in sites.items():
        path = f"sites.{site}.ranks"
        for rank in config.ranks or []:
            if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                raise error(path, f"ranks are integers from 0, got {rank!r}.")
            if rank in owner:
                also = "" if owner[rank] == site else f" (also under sites.{owner[rank]}.ranks)"
                raise error(path, f"rank {rank} is listed twice{also}; list each rank in "
                                  "one site.")
            owner[rank] = site


def assign_ranks(sites: dict, n: int, error) -> list[int]:
    """site_of[rank]: listed ranks go to their site; the others are split into contiguous,
    as-equal-as-possible blocks over the sites that list none (earlier sites get the extra
    one)."""
    names = list(sites)
    site_of = [-1] * n
    for index, site in enumerate(names):
        for rank in sites[site].ranks or []:
            if rank >= n:
                raise error(f"sites.{site}.ranks", f"rank {rank} is out of range: this run "
                                                   f"has {n} ranks (0 to {n - 1}).")
            site_of[rank] = index
    unlisted = [rank for rank in range(n) if site_of[rank] < 0]
    open_sites = [i for i, site in enumerate(names) if sites[site].ranks is None]
    if unlisted and not open_sites:
        raise error("sites", f"ranks {', '.join(map(str, unlisted))} are in no site; list "
                             "them under a site's ranks, or leave ranks out of a site to give "
                             "it the ranks no site lists.")
    start = 0
    for j, index in enumerate(open_sites):
        count = len(unlisted) // len(open_sites) + (j < len(unlisted) % len(open_sites))
        for rank in unlisted[start:start + count]:
            site_of[rank] = index
        start += count
    return site_of
