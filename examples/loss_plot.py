"""The loss curve the examples save beside their outputs (matplotlib, no display needed)."""


def save_loss_plot(path, curves, ylabel="loss"):
    """Plot each of `curves` ({label: per-step values}; a None label draws no legend) and
    write the figure to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, values in curves.items():
        ax.plot(values, label=label, linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if any(label is not None for label in curves):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
