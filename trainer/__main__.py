"""`python -m ftplane.trainer ...`: what ft_launcher runs on every rank."""

from ftplane.trainer.train import main

if __name__ == "__main__":
    main()
