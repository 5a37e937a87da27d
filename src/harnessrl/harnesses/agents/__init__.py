"""One module per real harness (and terminus-2's launcher, run beside its module): each
defines `HARNESS` and, where it speaks another dialect, `VARIANTS`; `harnesses.get` finds
them by name through `harnesses.MODULES`."""
