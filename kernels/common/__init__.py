"""What every runtime's compiled path shares: which kernel a call runs and its arguments."""
