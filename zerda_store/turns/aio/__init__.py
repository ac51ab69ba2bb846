"""The async twin of the turns' repository, under the same stem."""
