"""``python -m tss_opt +domain=qa [+model=llama13b]``: search a domain's target skip set."""

from tss_opt.cli.common import hydra_entry
from tss_opt.cli.search import search

main = hydra_entry(search)

if __name__ == "__main__":
    main()
