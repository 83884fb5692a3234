from services.consensus.main import main

main()
