"""What every lesson shows with: tables, the plot style, the kernel's source with its line numbers, check cells, the Chinese edition's punctuation tip. Imports the core only."""
