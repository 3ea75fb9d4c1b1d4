-- Stay-point cell sequences on a 32 x 32 grid (HRNet's input). Not private: for the data owner only.
from mob_cell_sequences('{{ ref("trips") }}', bbox := {{ var('bbox') }}, w := 32, outside := 'drop')
