"""One "c"-target specialization (a vector add of 256), for tests that run whole builds many times."""

from __future__ import annotations

import dataclasses

from tileship.catalog import cpu

add_one = dataclasses.replace(cpu.add, name="add_one", module=__name__, shapes=({"N": 256},), ranges=())
