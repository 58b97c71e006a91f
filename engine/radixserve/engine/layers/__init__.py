"""Model building blocks shared by every architecture, one file each."""
